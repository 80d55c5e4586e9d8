package idempgx_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idempgx"
)

// BenchmarkHolderBurst: 300 leases' heartbeats fall due together (a proxy
// or consumer that took them in one burst), and then their completions,
// each from its own goroutine, with statements shared and with one
// statement each, side by side on one server. Reported: calls per second
// and the slowest call of a burst (the heartbeat a short lease depends on).
//
//	go test -run '^$' -bench HolderBurst -benchtime 20x ./store/idempgx
func BenchmarkHolderBurst(b *testing.B) {
	const leases = 300
	for _, kind := range []string{"extend", "complete"} {
		for _, mode := range []string{"shared", "alone"} {
			b.Run(kind+"/"+mode, func(b *testing.B) {
				e := newExtendEnv(b, leases, false)
				if mode == "alone" {
					idempgx.ExtendAlone(e.s)
					idempgx.CompleteAlone(e.s)
				}
				ctx := ctxT(b)
				var slowest time.Duration
				b.ResetTimer()
				for n := range b.N {
					if kind == "complete" && n > 0 {
						// Fresh leases for this burst's completions.
						b.StopTimer()
						for key := range e.leases {
							cl, err := e.s.Claim(ctx, idem.ClaimRequest{Scope: "s", Key: fmt.Sprint(key, "-", n), Fingerprint: idem.Fingerprint{1}, Lease: time.Minute})
							if err != nil || cl.Outcome != idem.Acquired {
								b.Fatalf("claim: %+v, %v", cl, err)
							}
							e.leases[key] = cl.Token
						}
						b.StartTimer()
					}
					var wg sync.WaitGroup
					var mu sync.Mutex
					var errs []error
					for key, token := range e.leases {
						if kind == "complete" && n > 0 {
							key = fmt.Sprint(key, "-", n)
						}
						wg.Go(func() {
							start := time.Now()
							var err error
							if kind == "extend" {
								_, err = e.s.Extend(ctx, "s", key, token, time.Minute)
							} else {
								err = e.s.Complete(ctx, idem.CompleteRequest{Scope: "s", Key: key, Token: token, Result: []byte(`{"status":201}`), Retention: time.Hour})
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
				b.ReportMetric(float64(leases*b.N)/b.Elapsed().Seconds(), "calls/s")
				b.ReportMetric(float64(slowest.Milliseconds()), "slowest-ms")
			})
		}
	}
}
