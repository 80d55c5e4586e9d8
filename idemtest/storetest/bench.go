package storetest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// BurstLeases is how many leases [BenchHolderBurst] holds at once.
const BurstLeases = 300

// BenchHolderBurst measures a store's lease holders under a burst: 300
// leases' heartbeats fall due together (a proxy or consumer that took them
// in one burst), and then their completions, each call from its own
// goroutine. newStore returns a store over a fresh keyspace, with the
// store's grouping of holders' calls on (grouped) or off, so that a store
// that groups them can show both side by side in one run. Reported: calls
// per second and the slowest call of a burst (the heartbeat a short lease
// depends on), for extend/grouped, extend/alone, complete/grouped and
// complete/alone.
func BenchHolderBurst(b *testing.B, newStore func(b *testing.B, grouped bool) idem.Store) {
	for _, kind := range []string{"extend", "complete"} {
		for _, mode := range []string{"grouped", "alone"} {
			b.Run(kind+"/"+mode, func(b *testing.B) {
				s := newStore(b, mode == "grouped")
				ctx := context.Background()
				claim := func(burst int) map[string]int64 {
					leases := make(map[string]int64, BurstLeases)
					for i := range BurstLeases {
						key := fmt.Sprint("burst-", burst, "-", i)
						cl, err := s.Claim(ctx, idem.ClaimRequest{Scope: "s", Key: key, Fingerprint: idem.Fingerprint{1}, Lease: time.Minute})
						if err != nil || cl.Outcome != idem.Acquired {
							b.Fatalf("claim %s: %+v, %v", key, cl, err)
						}
						leases[key] = cl.Token
					}
					return leases
				}
				leases := claim(0)
				var slowest time.Duration
				b.ResetTimer()
				for n := range b.N {
					if kind == "complete" && n > 0 {
						// Fresh leases for this burst's completions.
						b.StopTimer()
						leases = claim(n)
						b.StartTimer()
					}
					var wg sync.WaitGroup
					var mu sync.Mutex
					var errs []error
					for key, token := range leases {
						wg.Go(func() {
							start := time.Now()
							var err error
							if kind == "extend" {
								_, err = s.Extend(ctx, "s", key, token, time.Minute)
							} else {
								err = s.Complete(ctx, idem.CompleteRequest{Scope: "s", Key: key, Token: token, Result: []byte(`{"status":201}`), Retention: time.Hour})
							}
							took := time.Since(start)
							mu.Lock()
							slowest = max(slowest, took)
							if err != nil {
								errs = append(errs, err)
							}
							mu.Unlock()
						})
					}
					wg.Wait()
					if len(errs) > 0 {
						b.Fatal(fmt.Sprint(len(errs), " calls failed: ", errs[0]))
					}
				}
				b.ReportMetric(float64(BurstLeases*b.N)/b.Elapsed().Seconds(), "calls/s")
				b.ReportMetric(float64(slowest.Milliseconds()), "slowest-ms")
			})
		}
	}
}
