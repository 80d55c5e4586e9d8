module github.com/idem-go/idem/store/idemredis

go 1.26

require github.com/idem-go/idem v0.0.0

replace github.com/idem-go/idem => ../..

require github.com/idem-go/idem/store/idemstoretest v0.0.0

replace github.com/idem-go/idem/store/idemstoretest => ../idemstoretest
