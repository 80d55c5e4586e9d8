module github.com/idem-go/idem/store/idemredis

go 1.26.0

require github.com/idem-go/idem v0.0.0

replace github.com/idem-go/idem => ../..

require (
	github.com/idem-go/idem/store/idemstoretest v0.0.0
	github.com/redis/rueidis v1.0.79
)

require golang.org/x/sys v0.48.0 // indirect

replace github.com/idem-go/idem/store/idemstoretest => ../idemstoretest
