package idemsqlite_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/store/idemsqlite"
)

// An order and its event in one transaction: the committed order's event
// is published, the rolled-back one's never exists.
func ExampleStore_Outbox() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "idem-outbox")
	defer os.RemoveAll(dir)
	s, err := idemsqlite.Open(ctx, filepath.Join(dir, "idem.db"), &idemsqlite.Config{AutoMigrate: true})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	if _, err := s.DB().ExecContext(ctx, "CREATE TABLE orders (id TEXT PRIMARY KEY)"); err != nil {
		log.Fatal(err)
	}
	ob := s.Outbox()
	placeOrder := func(id string, declined bool) error {
		tx, err := s.DB().BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }() // a no-op after Commit
		if _, err := tx.ExecContext(ctx, "INSERT INTO orders (id) VALUES (?)", id); err != nil {
			return err
		}
		if err := ob.Write(ctx, tx, outbox.Event{Topic: "orders.created", Key: id, ID: "order-created-" + id,
			Payload: []byte(`{"order":"` + id + `"}`)}); err != nil {
			return err
		}
		if declined {
			return errors.New("card declined")
		}
		return tx.Commit()
	}
	fmt.Println(placeOrder("A-1", false), placeOrder("A-2", true))

	// idemamqp.NewOutboxPublisher, idemnats, idemkafka or idemsqs in a
	// service; here a publisher that prints.
	pub := outbox.PublisherFunc(func(ctx context.Context, msgs []outbox.Message) []error {
		for _, m := range msgs {
			fmt.Printf("published %s: %s\n", m.ID, m.Payload)
		}
		return nil
	})
	relay, err := outbox.NewRelay(ob, pub, nil)
	if err != nil {
		log.Fatal(err)
	}
	n, err := relay.RunOnce(ctx) // relay.Run(ctx) in a service
	fmt.Println("claimed:", n, err)
	r, err := ob.GetByEventID(ctx, "order-created-A-1")
	fmt.Println(r.State, err)
	// Output:
	// <nil> card declined
	// published order-created-A-1: {"order":"A-1"}
	// claimed: 1 <nil>
	// sent <nil>
}
