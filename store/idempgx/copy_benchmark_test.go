package idempgx_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/jackc/pgx/v5"
)

// BenchmarkProcessBatchCopy compares ProcessBatch's COPY path with its
// INSERT path (Config.NoCopy) and with a COPY that looks its keys up first
// (as after a batch that met a stored key), for batches of fresh keys from
// 8 concurrent callers, with an empty handler: the cost of writing the
// records alone. The dup30 arms repeat a stored key in 30 % of each
// batch's messages (those batches' COPY looks its keys up first). The
// partitioned layout, which always inserts, is there for reference, with
// an older partition of olderRecords records that every key is looked for
// in. Run the arms side by side and read the ratios:
//
//	go test -run '^$' -bench 'ProcessBatchCopy' -benchtime 400x -count 3 ./store/idempgx
func BenchmarkProcessBatchCopy(b *testing.B) {
	arms := []struct{ layout, path string }{
		{"plain", "copy"}, {"plain", "insert"}, {"plain", "copy-lookup"},
		{"plain", "copy-dup30"}, {"plain", "insert-dup30"}, {"partitioned", "insert"},
	}
	for _, size := range []int{100, 1000} {
		for _, arm := range arms {
			b.Run(fmt.Sprintf("%s/%d/%s", arm.layout, size, arm.path), func(b *testing.B) {
				cfg := idempgx.Config{NoCopy: strings.HasPrefix(arm.path, "insert"), Partitioned: arm.layout == "partitioned"}
				dups := strings.HasSuffix(arm.path, "-dup30")
				var schema string
				if cfg.Partitioned {
					schema = newPartitionedStore(b, nil).Config().Schema
				} else {
					schema = migratedSchema(b)
				}
				s, copies := copyCounted(b, schema, cfg)
				if cfg.Partitioned {
					fillOlder(b, s, "", olderRecords)
				}
				ctx := context.Background()
				var next atomic.Int64
				b.SetParallelism(max(1, 8/runtime.GOMAXPROCS(0)))
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					msgs := make([]idem.Message, size)
					for pb.Next() {
						n := next.Add(1)
						for i := range msgs {
							k := fmt.Sprintf("b%08d-%04d", n, i)
							if dups && i%10 < 3 && n > 1 {
								// A key of an earlier batch, stored by now
								// unless that batch is still in flight.
								k = fmt.Sprintf("b%08d-%04d", max(1, n-16), i)
							}
							msgs[i] = idem.Message{Key: k, Fingerprint: idem.FingerprintBytes([]byte(k))}
						}
						if arm.path == "copy-lookup" {
							idempgx.SetCopyLooksFirst(s, true)
						}
						res, err := s.ProcessBatch(ctx, msgs, func(context.Context, pgx.Tx, []int) error { return nil })
						if err != nil {
							b.Error(err)
							return
						}
						if o := res[size-1]; o != idem.Processed && !(dups && o == idem.Duplicate) {
							b.Errorf("result %v, want processed", o)
							return
						}
					}
				})
				b.StopTimer()
				b.ReportMetric(float64(b.N*size)/b.Elapsed().Seconds(), "msgs/s")
				if want := strings.HasPrefix(arm.path, "copy"); (copies.starts.Load() > 0) != want {
					b.Fatalf("%d COPY statements on the %s arm", copies.starts.Load(), arm.path)
				}
			})
		}
	}
}

// olderRecords is how many records fillOlder leaves in an older partition.
const olderRecords = 200_000

// fillOlder writes n completed records of scope, keys old-1 to old-n,
// into s's current partition, moves the writes to the next one and
// analyzes the table.
func fillOlder(tb testing.TB, s *idempgx.Store, scope string, n int) {
	tb.Helper()
	ctx := context.Background()
	if _, err := s.Pool().Exec(ctx, `INSERT INTO `+qualified(s, "idem_records")+` (scope, key, bucket, state, fingerprint, token, completed_at, expires_at)
SELECT $1, 'old-' || i, (SELECT cur FROM `+qualified(s, "idem_record_buckets")+`), 'completed', sha256(i::text::bytea), 0, now(), now() + interval '1 hour'
FROM generate_series(1, $2) AS i`, scope, n); err != nil {
		tb.Fatal(err)
	}
	if rep, err := s.Maintain(ctx, &idempgx.MaintainOptions{Rotate: true, KeepExpired: true}); err != nil || !rep.Rotated {
		tb.Fatalf("rotate: %+v %v", rep, err)
	}
	if _, err := s.Pool().Exec(ctx, "ANALYZE "+qualified(s, "idem_records")); err != nil {
		tb.Fatal(err)
	}
}
