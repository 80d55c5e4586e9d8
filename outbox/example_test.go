package outbox_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/outbox/outboxtest"
)

// An order and its event are written in one transaction; the relay
// publishes the event only because the transaction committed. The
// in-memory outbox stands for a SQL store's (idempgx's Store.Outbox()
// writes in a pgx.Tx, idemsqlite's and idemmysql's in a *sql.Tx), and the
// publisher for a broker's (idemamqp, idemnats, idemkafka, idemsqs).
func Example() {
	ctx := context.Background()
	ob := outboxtest.NewMemory()

	// The producer: the business write and the event, atomically.
	placeOrder := func(id string, fail bool) error {
		return ob.InTx(ctx, func(ctx context.Context, tx *outboxtest.MemoryTx) error {
			// … INSERT INTO orders … in tx …
			if err := ob.Write(ctx, tx, outbox.Event{Topic: "orders.created", Key: id, ID: "order-created-" + id,
				Payload: []byte(`{"order":"` + id + `"}`)}); err != nil {
				return err
			}
			if fail {
				return errors.New("card declined") // rolls back the order and its event
			}
			return nil
		})
	}
	fmt.Println(placeOrder("1001", false) == nil, placeOrder("1002", true) == nil)

	pub := outbox.PublisherFunc(func(ctx context.Context, msgs []outbox.Message) []error {
		for _, m := range msgs {
			fmt.Printf("publish %s to %s (attempt %d): %s\n", m.ID, m.Topic, m.Attempt, m.Payload)
		}
		return nil // every message confirmed
	})
	relay, err := outbox.NewRelay(ob, pub, nil)
	if err != nil {
		panic(err)
	}
	n, err := relay.RunOnce(ctx) // Run(ctx) in a service
	fmt.Println(n, err)
	st, _ := ob.Stats(ctx)
	for _, c := range st {
		fmt.Println(c.State, c.Count)
	}
	// Output:
	// true false
	// publish order-created-1001 to orders.created (attempt 1): {"order":"1001"}
	// 1 <nil>
	// pending 0
	// sending 0
	// sent 1
	// dead 0
}
