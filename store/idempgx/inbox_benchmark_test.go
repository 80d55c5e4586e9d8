package idempgx_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/inbox/inboxdriver"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/jackc/pgx/v5"
)

// fillInbox bulk-loads processed and pending rows with one INSERT … SELECT
// generate_series each, then analyzes the table so the planner sees its
// real size.
func fillInbox(b *testing.B, s *idempgx.Store, processed, pending int) {
	b.Helper()
	ctx := context.Background()
	t := qualified(s, "idem_inbox")
	start := time.Now()
	for _, q := range []struct {
		sql string
		n   int
	}{
		{`INSERT INTO ` + t + ` (source, message_id, type, payload, fingerprint, state, received_at, next_attempt_at, processed_at)
SELECT 'bench', 'p-' || g, 'bench', '\x7b7d'::bytea, sha256(g::text::bytea), 'processed', now() - interval '1 hour', now() - interval '1 hour', now() - interval '30 minutes'
FROM generate_series(1, $1) AS g`, processed},
		{`INSERT INTO ` + t + ` (source, message_id, type, payload, fingerprint, received_at, next_attempt_at)
SELECT 'bench', 'q-' || g, 'bench', '\x7b7d'::bytea, sha256(g::text::bytea), now() - interval '10 minutes', now() - interval '10 minutes' + g * interval '1 millisecond'
FROM generate_series(1, $1) AS g`, pending},
	} {
		if _, err := s.Pool().Exec(ctx, q.sql, q.n); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := s.Pool().Exec(ctx, "ANALYZE "+t); err != nil {
		b.Fatal(err)
	}
	b.Logf("loaded %d processed + %d pending rows in %v", processed, pending, time.Since(start).Round(time.Millisecond))
}

// BenchmarkInboxClaim measures one claim of 10 due rows at two table
// sizes. The partial index on unfinished rows keeps it flat: the processed
// rows are never scanned. The large size (1M processed + 100k pending) runs
// only with IDEM_INBOX_BENCH_BIG=1 and never under -short.
func BenchmarkInboxClaim(b *testing.B) {
	sizes := []struct{ processed, pending int }{{100_000, 10_000}, {1_000_000, 100_000}}
	for i, size := range sizes {
		b.Run(fmt.Sprintf("processed=%d/pending=%d", size.processed, size.pending), func(b *testing.B) {
			if i > 0 && (testing.Short() || os.Getenv("IDEM_INBOX_BENCH_BIG") == "") {
				b.Skip("set IDEM_INBOX_BENCH_BIG=1 (and drop -short) for the 1M-row table")
			}
			s := newStore(b, nil)
			fillInbox(b, s, size.processed, size.pending)
			ib := s.Inbox()
			ctx := context.Background()
			reset := "UPDATE " + qualified(s, "idem_inbox") + " SET state = 'pending', next_attempt_at = received_at WHERE state = 'running'"
			claimed := 0
			b.ResetTimer()
			for b.Loop() {
				rows, err := ib.Claim(ctx, inboxdriver.ClaimRequest{Limit: 10, Lease: time.Hour})
				if err != nil || len(rows) != 10 {
					b.Fatalf("claim = %d rows, %v", len(rows), err)
				}
				claimed += len(rows)
				if claimed+10 > size.pending {
					b.StopTimer()
					if _, err := s.Pool().Exec(ctx, reset); err != nil {
						b.Fatal(err)
					}
					claimed = 0
					b.StartTimer()
				}
			}
		})
	}
}

// BenchmarkInboxThroughput processes b.N messages with 8 worker loops whose
// handler inserts one effect row, claiming 100 rows at a time versus one.
// Run with e.g. -benchtime=5000x; it reports msgs/s.
func BenchmarkInboxThroughput(b *testing.B) {
	for _, batch := range []int{100, 1} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			env, s := newInboxEnv(b)
			ctx := context.Background()
			rows := make([][]any, b.N)
			for i := range rows {
				rows[i] = []any{"bench", fmt.Sprintf("m-%d", i), "effect", []byte("{}"), make([]byte, 32)}
			}
			if _, err := s.Pool().CopyFrom(ctx, pgx.Identifier{s.Config().Schema, "idem_inbox"},
				[]string{"source", "message_id", "type", "payload", "fingerprint"}, pgx.CopyFromRows(rows)); err != nil {
				b.Fatal(err)
			}
			w, err := inbox.NewWorker(env.Backend, &inbox.Config{Workers: 8, BatchSize: batch, PollInterval: 5 * time.Millisecond,
				PurgeInterval: -1, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				b.Fatal(err)
			}
			_ = w.Handle("effect", func(ctx context.Context, tx pgx.Tx, m inbox.Message) error { return env.Effect(ctx, tx, m.ID) })
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
