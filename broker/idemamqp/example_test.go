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

// processor is what a SQL store offers (idempgx.Store, idemsqlite.Store):
// the dedupe record and the effect in one transaction.
type processor interface {
	Process(ctx context.Context, msg idem.Message, fn func(ctx context.Context, tx *sql.Tx) error) (idem.Outcome, error)
}

func Example() {
	var store processor // e.g. an *idemsqlite.Store
	process := func(ctx context.Context, msg idem.Message, d consume.Delivery) (idem.Outcome, error) {
		return store.Process(ctx, msg, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `UPDATE accounts SET balance = balance + 1 WHERE id = ?`, string(d.Body()))
			return err
		})
	}
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
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.Run(ctx)
}
