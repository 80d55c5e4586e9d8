module github.com/idem-go/idem/broker/idemamqp

go 1.26.0

require github.com/idem-go/idem v0.1.0

require (
	github.com/idem-go/idem/store/idempgx v0.1.0
	github.com/jackc/pgx/v5 v5.12.0
	github.com/rabbitmq/amqp091-go v1.16.0
	go.uber.org/goleak v1.3.0
)

require (
	github.com/idem-go/idem/shared v0.1.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/text v0.41.0 // indirect
)

// Tests bind the consumer to the PostgreSQL store; the module's own code
// does not import it.
