package idemsqlite

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/idem-go/idem/inbox"
)

// BenchmarkInboxThroughput processes b.N messages with 4 worker loops whose
// handler inserts one effect row, claiming 100 rows at a time versus one.
// Run with e.g. -benchtime=3000x; it reports msgs/s.
func BenchmarkInboxThroughput(b *testing.B) {
	for _, batch := range []int{100, 1} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			s := newBenchStore(b)
			env := inboxEnv(b, s)
			ctx := context.Background()
			tx, err := s.DB().BeginTx(ctx, nil)
			if err != nil {
				b.Fatal(err)
			}
			for i := range b.N {
				m := inbox.Message{Source: "bench", ID: fmt.Sprintf("m-%d", i), Type: "effect", Payload: []byte("{}")}
				if _, err := s.Inbox().ReceiveTx(ctx, tx, m); err != nil {
					b.Fatal(err)
				}
			}
			if err := tx.Commit(); err != nil {
				b.Fatal(err)
			}
			w, err := inbox.NewWorker(env.Backend, &inbox.Config{Workers: 4, BatchSize: batch, PollInterval: 5 * time.Millisecond,
				PurgeInterval: -1, Logger: quietLogger})
			if err != nil {
				b.Fatal(err)
			}
			_ = w.Handle("effect", func(ctx context.Context, tx *sql.Tx, m inbox.Message) error { return env.Effect(ctx, tx, m.ID) })
			b.ResetTimer()
			start := time.Now()
			if err := w.Start(ctx); err != nil {
				b.Fatal(err)
			}
			for {
				st, err := env.Backend.Stats(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if st[2].Count == int64(b.N) {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			elapsed := time.Since(start)
			b.StopTimer()
			if err := w.Stop(ctx); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
		})
	}
}
