package idemsqlite

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// Run side by side with:
//
//	go test -run '^$' -bench . -benchtime=2000x

func newBenchStore(b *testing.B) *Store {
	b.Helper()
	s, err := Open(context.Background(), b.TempDir()+"/bench.db", &Config{AutoMigrate: true, Logger: quietLogger})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	if _, err := s.DB().Exec("CREATE TABLE effects (key TEXT NOT NULL)"); err != nil {
		b.Fatal(err)
	}
	return s
}

// BenchmarkClaimComplete is the lease path: one Claim and one Complete
// (two write transactions) per op.
func BenchmarkClaimComplete(b *testing.B) {
	s := newBenchStore(b)
	ctx := context.Background()
	result := []byte(`{"status":"ok"}`)
	b.ResetTimer()
	for i := range b.N {
		key := fmt.Sprintf("k%d", i)
		c, err := s.Claim(ctx, idem.ClaimRequest{Scope: "bench", Key: key, Lease: time.Minute})
		if err != nil || c.Outcome != idem.Acquired {
			b.Fatalf("claim: %v %v", c.Outcome, err)
		}
		if err := s.Complete(ctx, idem.CompleteRequest{Scope: "bench", Key: key, Token: c.Token, Result: result, Retention: time.Hour}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkProcess is the transactional path, one message (dedupe row and
// effect row) per transaction.
func BenchmarkProcess(b *testing.B) {
	s := newBenchStore(b)
	ctx := context.Background()
	b.ResetTimer()
	for i := range b.N {
		msg := idem.Message{Scope: "bench", Key: fmt.Sprintf("k%d", i)}
		res, err := s.Process(ctx, msg, func(ctx context.Context, tx *sql.Tx) error {
			return insertEffect(ctx, tx, msg.Key)
		})
		if err != nil || res != idem.Processed {
			b.Fatalf("process: %v %v", res, err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkProcessBatch100 is the transactional path with 100 messages per
// transaction; one op is one message, so ns/op compares directly with
// BenchmarkProcess.
func BenchmarkProcessBatch100(b *testing.B) {
	const size = 100
	s := newBenchStore(b)
	ctx := context.Background()
	msgs := make([]idem.Message, 0, size)
	flush := func() {
		res, err := s.ProcessBatch(ctx, msgs, func(ctx context.Context, tx *sql.Tx, fresh []int) error {
			for _, i := range fresh {
				if err := insertEffect(ctx, tx, msgs[i].Key); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil || len(res) != len(msgs) {
			b.Fatalf("batch: %v %v", len(res), err)
		}
		msgs = msgs[:0]
	}
	b.ResetTimer()
	for i := range b.N {
		msgs = append(msgs, idem.Message{Scope: "bench", Key: fmt.Sprintf("k%d", i)})
		if len(msgs) == size {
			flush()
		}
	}
	if len(msgs) > 0 {
		flush()
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}
