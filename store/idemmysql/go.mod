module github.com/idem-go/idem/store/idemmysql

go 1.26.0

require github.com/idem-go/idem v0.1.0

require (
	github.com/go-sql-driver/mysql v1.10.2
	go.uber.org/goleak v1.3.0
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/idem-go/idem/shared v0.1.0
)
