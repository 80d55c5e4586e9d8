package idemnats_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemnats"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/store/idemsqlite"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func ExampleContentID() {
	first := idemnats.ContentID([]byte(`{"order":42}`))
	retried := idemnats.ContentID([]byte(`{"order":42}`))
	changed := idemnats.ContentID([]byte(`{"order":43}`))
	fmt.Println(first == retried)
	fmt.Println(first == changed)
	// Output:
	// true
	// false
}

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

	c, err := idemnats.NewConsumer(ctx, js, &idemnats.Config{
		Config:            consume.Config{Name: "billing"},
		Stream:            "ORDERS",
		Consumer:          "billing",
		DeadLetterSubject: "orders.dead",
		Process: func(ctx context.Context, msg idem.Message, d consume.Delivery) (idem.Outcome, error) {
			return store.Process(ctx, msg, func(ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO invoices (msg_id, body) VALUES (?, ?)`, msg.Key, d.Body())
				return err
			})
		},
	})
	if err != nil {
		log.Fatal(err) // e.g. the dedupe window is shorter than AckWait × MaxDeliver
	}
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
