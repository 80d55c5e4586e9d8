package idemnats_test

import (
	"context"
	"database/sql"
	"log"
	"os"

	"github.com/idem-go/idem/broker/idemnats"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/store/idemsqlite"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Consume a durable JetStream consumer with the SQLite store: the dedupe
// record and the effect commit together, and the message is acked after.
func ExampleNewConsumer() {
	ctx := context.Background()
	nc, err := nats.Connect(os.Getenv("IDEM_NATS_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	store, err := idemsqlite.Open(ctx, "sqlite://idem.db", &idemsqlite.Config{AutoMigrate: true})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	c, err := idemnats.NewConsumer(js, &idemnats.Config{
		Config:            consume.Config{Name: "billing"},
		Stream:            "ORDERS",
		Consumer:          "billing",
		DeadLetterSubject: "orders.dead",
		// The dedupe record and the effect in one transaction of the store.
		Process: consume.Transactional(store, func(ctx context.Context, tx *sql.Tx, d consume.Delivery) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO invoices (msg_id, body) VALUES (?, ?)`, d.ID(), d.Body())
			return err
		}),
	})
	if err != nil {
		log.Fatal(err) // the configuration alone is wrong
	}
	if err := c.Ping(ctx); err != nil {
		log.Fatal(err) // e.g. the dedupe window is shorter than AckWait × MaxDeliver
	}
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
