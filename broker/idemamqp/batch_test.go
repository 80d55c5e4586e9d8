package idemamqp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemamqp"
	"github.com/idem-go/idem/consume"
	"github.com/jackc/pgx/v5"
)

// batchProcess binds the consumer to idempgx.ProcessBatch: one dedupe
// statement and one transaction per batch, the fresh credits sent in one
// pipelined round trip.
func (e *pgEnv) batchProcess() consume.BatchProcessFunc {
	return func(ctx context.Context, msgs []idem.Message, ds []consume.Delivery) ([]idem.Outcome, error) {
		return e.store.ProcessBatch(ctx, msgs, func(ctx context.Context, tx pgx.Tx, fresh []int) error {
			b := &pgx.Batch{}
			for _, i := range fresh {
				var p payment
				if err := json.Unmarshal(ds[i].Body(), &p); err != nil {
					return err
				}
				b.Queue(fmt.Sprintf(`INSERT INTO %s (account, amount, applied) VALUES ($1, $2, 1)
					ON CONFLICT (account) DO UPDATE SET amount = balances.amount + EXCLUDED.amount, applied = balances.applied + 1`, e.table()), p.Account, p.Amount)
			}
			return tx.SendBatch(ctx, b).Close()
		})
	}
}

func batchConfig(pg *pgEnv) func(*idemamqp.Config) {
	return func(cfg *idemamqp.Config) {
		cfg.BatchProcess, cfg.BatchSize, cfg.BatchWait = pg.batchProcess(), 50, 5*time.Millisecond
	}
}

// TestBatchMode: batches with duplicates inside and across them, plus a
// poison message that makes its batch fall back to one-by-one handling.
func TestBatchMode(t *testing.T) {
	t.Parallel()
	pg := newPG(t)
	topo, conn := newTopology(t)
	const msgs = 300
	c, counters := newConsumer(t, idemamqp.DialURL(amqpURL(t)), topo, pg.idemProcess(pg.creditHandler(nil)), batchConfig(pg))
	ids := make([]int, 0, msgs*13/10)
	for i := range msgs {
		ids = append(ids, i)
	}
	for range msgs * 3 / 10 {
		ids = append(ids, rand.IntN(msgs))
	}
	rand.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
	for _, i := range ids {
		publish(t, conn, topo.Queue, fmt.Sprintf("b-%d", i), body(fmt.Sprintf("acct-%d", i), 2), 1)
	}
	publish(t, conn, topo.Queue, "poison", []byte("not json"), 1)
	runConsumer(t, c)
	waitFor(t, 20*time.Second, "every delivery", func() bool {
		s := counters.Snapshot()
		return s.Processed+s.Duplicate == int64(len(ids)) && s.DeadLettered == 1
	})
	var n, total, maxApplied int
	if err := pg.pool.QueryRow(context.Background(), fmt.Sprintf("SELECT count(*), sum(amount), max(applied) FROM %s", pg.table())).Scan(&n, &total, &maxApplied); err != nil {
		t.Fatal(err)
	}
	if n != msgs || total != 2*msgs || maxApplied != 1 {
		t.Fatalf("ledger: %d accounts, total %d, max applications %d", n, total, maxApplied)
	}
}
