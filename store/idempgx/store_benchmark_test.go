package idempgx_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/jackc/pgx/v5"
)

// benchParallelism gives 4 goroutines per GOMAXPROCS: enough to hide round
// trips on a 2-core machine without drowning the server.
const benchParallelism = 4

// Run with:
//
//	IDEM_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test?sslmode=disable \
//	  go test -run '^$' -bench . -benchtime=2s ./store/idempgx/

func BenchmarkClaimComplete(b *testing.B) {
	s := newStore(b, nil)
	ctx := context.Background()
	var seq atomic.Int64
	result := []byte(`{"status":201}`)
	b.SetParallelism(benchParallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			key := fmt.Sprintf("k%d", seq.Add(1))
			c, err := s.Claim(ctx, idem.ClaimRequest{Key: key, Lease: time.Minute})
			if err != nil || c.Outcome != idem.Acquired {
				b.Fatal(c, err)
			}
			if err := s.Complete(ctx, idem.CompleteRequest{Key: key, Token: c.Token, Result: result, Retention: time.Hour}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}

// ledger is the effect of the Process benchmarks: every message adds 1 to
// an account balance. Each benchmark goroutine owns one account so that
// the benchmark measures idem, not contention on one row.
type ledger struct {
	s        *idempgx.Store
	accounts string
	worker   atomic.Int64
}

func newLedger(b *testing.B) *ledger {
	b.Helper()
	s := newStore(b, nil)
	l := &ledger{s: s, accounts: qualified(s, "accounts")}
	ctx := context.Background()
	if _, err := s.Pool().Exec(ctx, "CREATE TABLE "+l.accounts+" (id int PRIMARY KEY, balance bigint NOT NULL)"); err != nil {
		b.Fatal(err)
	}
	if _, err := s.Pool().Exec(ctx, "INSERT INTO "+l.accounts+" SELECT g, 0 FROM generate_series(0, 255) g"); err != nil {
		b.Fatal(err)
	}
	return l
}

// check verifies that every message credited its account exactly once.
func (l *ledger) check(b *testing.B, msgs int) {
	b.Helper()
	var total int64
	if err := l.s.Pool().QueryRow(context.Background(), "SELECT coalesce(sum(balance), 0) FROM "+l.accounts).Scan(&total); err != nil {
		b.Fatal(err)
	}
	if total != int64(msgs) {
		b.Fatalf("ledger total %d after %d messages", total, msgs)
	}
}

// benchLedger runs process (one call = size messages, all for the calling
// goroutine's account) in parallel and reports messages per second.
func benchLedger(b *testing.B, size int, process func(l *ledger, account int64, next func() string) error) {
	l := newLedger(b)
	var seq atomic.Int64
	next := func() string { return fmt.Sprintf("m%d", seq.Add(1)) }
	b.SetParallelism(benchParallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		account := l.worker.Add(1) % 256
		for pb.Next() {
			if err := process(l, account, next); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N*size)/b.Elapsed().Seconds(), "msgs/s")
	l.check(b, b.N*size)
}

func BenchmarkProcessSingle(b *testing.B) {
	ctx := context.Background()
	benchLedger(b, 1, func(l *ledger, account int64, next func() string) error {
		res, err := l.s.Process(ctx, idem.Message{Scope: "ledger", Key: next()}, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "UPDATE "+l.accounts+" SET balance = balance + 1 WHERE id = $1", account)
			return err
		})
		if err == nil && res != idem.Processed {
			err = fmt.Errorf("result %v, want processed", res)
		}
		return err
	})
}

func BenchmarkProcessBatch100(b *testing.B) {
	const size = 100
	ctx := context.Background()
	benchLedger(b, size, func(l *ledger, account int64, next func() string) error {
		msgs := make([]idem.Message, size)
		for i := range msgs {
			msgs[i] = idem.Message{Scope: "ledger", Key: next()}
		}
		res, err := l.s.ProcessBatch(ctx, msgs, func(ctx context.Context, tx pgx.Tx, fresh []int) error {
			_, err := tx.Exec(ctx, "UPDATE "+l.accounts+" SET balance = balance + $2 WHERE id = $1", account, len(fresh))
			return err
		})
		if err == nil && (len(res) != size || res[size-1] != idem.Processed) {
			err = fmt.Errorf("results %v, want all processed", res)
		}
		return err
	})
}
