package inbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"log"
	"os"
	"os/signal"

	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/inbox/inboxdriver"
	"github.com/idem-go/idem/retry"
)

// newBackend stands for a store's inbox: idemsqlite's Store.Inbox() (an
// inboxdriver.Backend[*sql.Tx]) or idempgx's (an inboxdriver.Backend[pgx.Tx]).
var newBackend func() inboxdriver.Backend[*sql.Tx]

// A worker that applies "payment.captured" events to a ledger in the same
// transaction that marks them processed.
func Example() {
	if newBackend == nil {
		return // needs a store; see store/idemsqlite's inbox example
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	w, err := inbox.NewWorker(newBackend(), &inbox.Config{Workers: 8, BatchSize: 50, Ordered: true})
	if err != nil {
		log.Fatal(err)
	}
	err = w.Handle("payment.captured", func(ctx context.Context, tx *sql.Tx, msg inbox.Message) error {
		var p struct {
			Account string `json:"account"`
			Cents   int64  `json:"cents"`
		}
		if err := json.Unmarshal(msg.Payload, &p); err != nil {
			return retry.Permanent(err) // malformed: dead at once
		}
		_, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = balance + ? WHERE id = ?", p.Cents, p.Account)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := w.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
