package idempgx_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/jackc/pgx/v5"
)

// BenchmarkPipelinedBegin runs, side by side in one process, the textbook
// transaction (BEGIN; INSERT … ON CONFLICT DO NOTHING; UPDATE; COMMIT),
// Process with its BEGIN sent with the first statement ("pipelined") and
// Process with BEGIN sent alone ("alone", as pool.Begin does), and the
// same two for ProcessBatch of 100, each worker taking the variants in
// turn, one call each, so that they all meet the same load; it prints each
// one's messages per second (its messages over the time its calls took,
// per worker; median and min–max of the rounds) and the ratios. Run with:
//
//	go test -run '^$' -bench PipelinedBegin -benchtime 1x ./store/idempgx/
//
// IDEM_PGP_ROUNDS sets the rounds (default 5).
func BenchmarkPipelinedBegin(b *testing.B) {
	rounds := envInt("IDEM_PGP_ROUNDS", 5)
	defer idempgx.SetPipelineBegin(true)
	ctx := context.Background()
	l := newLedger(b)
	processed := qualified(l.s, "processed")
	if _, err := l.s.Pool().Exec(ctx, "CREATE TABLE "+processed+" (id text PRIMARY KEY)"); err != nil {
		b.Fatal(err)
	}
	var gen atomic.Int64
	// stream returns n keys of which dup% repeat an earlier key of the
	// same stream (a redelivery of a committed message).
	stream := func(n, dup int) []string {
		prefix := fmt.Sprintf("s%d-", gen.Add(1))
		r := rand.New(rand.NewPCG(uint64(n), uint64(dup)))
		keys := make([]string, n)
		fresh := 0
		for i := range keys {
			if fresh > 0 && r.IntN(100) < dup {
				keys[i] = keys[r.IntN(i)]
				continue
			}
			keys[i] = prefix + fmt.Sprint(fresh)
			fresh++
		}
		return keys
	}
	credit := func(ctx context.Context, tx pgx.Tx, w, n int) error {
		_, err := tx.Exec(ctx, "UPDATE "+l.accounts+" SET balance = balance + $2 WHERE id = $1", w, n)
		return err
	}
	process := func(pipelined bool) func(ctx context.Context, w int, keys []string) error {
		return func(ctx context.Context, w int, keys []string) error {
			idempgx.SetPipelineBegin(pipelined)
			_, err := l.s.Process(ctx, idem.Message{Scope: "pgp", Key: keys[0]}, func(ctx context.Context, tx pgx.Tx) error {
				return credit(ctx, tx, w, 1)
			})
			return err
		}
	}
	batch := func(pipelined bool) func(ctx context.Context, w int, keys []string) error {
		return func(ctx context.Context, w int, keys []string) error {
			idempgx.SetPipelineBegin(pipelined)
			msgs := make([]idem.Message, len(keys))
			for i, k := range keys {
				msgs[i] = idem.Message{Scope: "pgp-batch", Key: k}
			}
			_, err := l.s.ProcessBatch(ctx, msgs, func(ctx context.Context, tx pgx.Tx, fresh []int) error {
				return credit(ctx, tx, w, len(fresh))
			})
			return err
		}
	}
	variants := []struct {
		name string
		size int // messages per call
		run  func(ctx context.Context, w int, keys []string) error
	}{
		{"textbook", 1, func(ctx context.Context, w int, keys []string) error {
			return pgx.BeginFunc(ctx, l.s.Pool(), func(tx pgx.Tx) error {
				tag, err := tx.Exec(ctx, "INSERT INTO "+processed+" (id) VALUES ($1) ON CONFLICT DO NOTHING", keys[0])
				if err != nil || tag.RowsAffected() == 0 {
					return err
				}
				return credit(ctx, tx, w, 1)
			})
		}},
		{"Process pipelined", 1, process(true)},
		{"Process alone", 1, process(false)},
		{"ProcessBatch pipelined", 100, batch(true)},
		{"ProcessBatch alone", 100, batch(false)},
	}
	type cell struct{ c, dup int }
	cells := []cell{{1, 0}, {1, 30}, {8, 0}, {8, 30}}
	rates := map[cell]map[string][]float64{}
	for _, ce := range cells {
		rates[ce] = map[string][]float64{}
	}
	var sb strings.Builder
	for range rounds {
		for _, ce := range cells {
			// Every worker runs the variants in turn, one call each, so
			// that all of them meet the same load; each variant's rate is
			// its messages over the time its calls took, per worker.
			calls := 150 // per variant and worker
			keys := make([][]string, len(variants))
			next := make([]atomic.Int64, len(variants))
			nanos := make([]atomic.Int64, len(variants))
			for k, v := range variants {
				keys[k] = stream(calls*ce.c*v.size, ce.dup)
			}
			var wg sync.WaitGroup
			errs := make(chan error, ce.c)
			for w := range ce.c {
				wg.Go(func() {
					for step := range calls * len(variants) {
						// Each worker starts at its own variant, and every
						// other cycle goes backwards, so that no variant
						// always follows the same one.
						pos := step % len(variants)
						if step/len(variants)%2 == 1 {
							pos = len(variants) - 1 - pos
						}
						k := (pos + w) % len(variants)
						v := variants[k]
						i := int(next[k].Add(int64(v.size))) - v.size
						start := time.Now()
						if err := v.run(ctx, w, keys[k][i:i+v.size]); err != nil {
							errs <- fmt.Errorf("%s: %w", v.name, err)
							return
						}
						nanos[k].Add(int64(time.Since(start)))
					}
				})
			}
			wg.Wait()
			close(errs)
			if err := <-errs; err != nil {
				b.Fatal(err)
			}
			for k, v := range variants {
				perWorker := time.Duration(nanos[k].Load()) / time.Duration(ce.c)
				rates[ce][v.name] = append(rates[ce][v.name], float64(len(keys[k]))/perWorker.Seconds())
			}
		}
	}
	stat := func(xs []float64) (med, lo, hi float64) {
		s := slices.Sorted(slices.Values(xs))
		return s[len(s)/2], s[0], s[len(s)-1]
	}
	for _, ce := range cells {
		fmt.Fprintf(&sb, "\nc=%d dup=%d%%, %d rounds\n", ce.c, ce.dup, rounds)
		for _, v := range variants {
			med, lo, hi := stat(rates[ce][v.name])
			fmt.Fprintf(&sb, "  %-24s %8.0f msgs/s (%.0f–%.0f)\n", v.name, med, lo, hi)
		}
		ratio := func(a, bb string) {
			xs := make([]float64, rounds)
			for i := range xs {
				xs[i] = rates[ce][a][i] / rates[ce][bb][i]
			}
			med, lo, hi := stat(xs)
			fmt.Fprintf(&sb, "  %s / %s = %.2f (%.2f–%.2f, per round)\n", a, bb, med, lo, hi)
		}
		ratio("Process pipelined", "textbook")
		ratio("Process alone", "textbook")
		ratio("Process pipelined", "Process alone")
		ratio("ProcessBatch pipelined", "ProcessBatch alone")
		ratio("ProcessBatch pipelined", "textbook")
	}
	fmt.Print(sb.String()) // b.Log would cut it
}
