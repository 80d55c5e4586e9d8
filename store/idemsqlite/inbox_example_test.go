package idemsqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/store/idemsqlite"
)

// Receive a message twice (a broker redelivery), process it once with its
// effect in the same transaction as the processed mark.
func ExampleStore_Inbox() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "idem-inbox")
	defer os.RemoveAll(dir)
	s, err := idemsqlite.Open(ctx, filepath.Join(dir, "idem.db"), &idemsqlite.Config{AutoMigrate: true})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	if _, err := s.DB().ExecContext(ctx, "CREATE TABLE shipments (order_id TEXT)"); err != nil {
		log.Fatal(err)
	}
	ib := s.Inbox()
	msg := inbox.Message{Source: "orders", ID: "evt-1", Type: "order.paid", Payload: []byte(`{"order":"A-1"}`)}
	for range 2 {
		isNew, err := ib.Receive(ctx, msg) // then ack the broker
		fmt.Println("new:", isNew, err)
	}

	w, err := inbox.NewWorker(ib, nil)
	if err != nil {
		log.Fatal(err)
	}
	err = w.Handle("order.paid", func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO shipments (order_id) VALUES (?)", m.ID)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	n, err := w.RunOnce(ctx)
	fmt.Println("claimed:", n, err)

	var shipments int
	_ = s.DB().QueryRowContext(ctx, "SELECT count(*) FROM shipments").Scan(&shipments)
	st, _ := ib.Stats(ctx)
	fmt.Println("shipments:", shipments, "processed:", st[2].Count)
	// Output:
	// new: true <nil>
	// new: false <nil>
	// claimed: 1 <nil>
	// shipments: 1 processed: 1
}
