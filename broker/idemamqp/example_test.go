package idemamqp_test

import (
	"context"
	"database/sql"
	"log"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemamqp"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/retry"
)

func Example() {
	var store idem.Processor[*sql.Tx] // e.g. an *idemsqlite.Store
	// The dedupe record and the effect in one transaction of the store.
	process := consume.Transactional(store, func(ctx context.Context, tx *sql.Tx, d consume.Delivery) error {
		_, err := tx.ExecContext(ctx, `UPDATE accounts SET balance = balance + 1 WHERE id = ?`, string(d.Body()))
		return err
	})
	c, err := idemamqp.NewConsumer(idemamqp.DialURL("amqp://guest:guest@127.0.0.1:5672/"), &idemamqp.Config{
		Config: consume.Config{
			Name:  "credits",
			Retry: &retry.Policy{Base: time.Second, Cap: time.Minute, MaxAttempts: 5},
		},
		Topology: idemamqp.Topology{Queue: "credits"},
		Declare:  true,
		Process:  process,
	})
	if err != nil {
		log.Fatal(err) // the configuration alone is wrong
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := c.Ping(ctx); err != nil {
		log.Fatal(err) // the broker is unreachable
	}
	_ = c.Run(ctx)
}
