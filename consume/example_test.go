package consume_test

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consume"
)

func ExampleCheckRetention() {
	err := consume.CheckRetention(time.Hour, 8, 10*time.Minute,
		consume.Window{Name: "queue x-message-ttl", D: 30 * time.Minute})
	fmt.Println(err)
	// Output:
	// idem: invalid configuration: dedupe retention 1h0m0s is shorter than the redelivery horizon 1h20m0s (max_attempts 8 × max_backoff 10m0s); a late duplicate would be processed twice: raise the retention above 1h20m0s
}

func ExampleDeadLetter_Headers() {
	dl := consume.DeadLetter{
		State:    consume.State{Attempts: 3, LastError: "gateway timeout"},
		Reason:   idem.DeadMaxAttempts,
		Consumer: "payments",
		Origin:   "orders/order.created",
	}
	h := dl.Headers()
	fmt.Println(h[consume.HeaderReason], h[consume.HeaderAttempts], h[consume.HeaderConsumer], h[consume.HeaderOrigin], h[consume.HeaderLastError])
	// Output: max_attempts 3 payments orders/order.created gateway timeout
}

// The transactional path: the dedupe record and the effect commit in one
// transaction of a SQL store (any idem.Processor: an *idemsqlite.Store
// here, an *idempgx.Store with pgx.Tx likewise). Give process (or
// processBatch) to a broker adapter's Config.
func ExampleTransactional() {
	var store idem.Processor[*sql.Tx] // e.g. an *idemsqlite.Store
	process := consume.Transactional(store, func(ctx context.Context, tx *sql.Tx, d consume.Delivery) error {
		_, err := tx.ExecContext(ctx, `UPDATE accounts SET balance = balance + 1 WHERE id = ?`, string(d.Body()))
		return err
	})
	processBatch := consume.TransactionalBatch(store, func(ctx context.Context, tx *sql.Tx, fresh []consume.Delivery) error {
		for _, d := range fresh {
			if _, err := tx.ExecContext(ctx, `UPDATE accounts SET balance = balance + 1 WHERE id = ?`, string(d.Body())); err != nil {
				return err
			}
		}
		return nil
	})
	engine, err := consume.New(process, &consume.Config{Name: "credits"})
	_, _, _ = engine, err, processBatch
}
