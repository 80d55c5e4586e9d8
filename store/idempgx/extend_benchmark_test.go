package idempgx_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/store/idempgx"
)

// BenchmarkExtendBurst: the heartbeats of 300 leases fall due together
// (a proxy or consumer that took them in one burst), each from its own
// goroutine, with heartbeats sharing statements and one statement each, side
// by side on one server. Reported: heartbeats per second and the slowest
// heartbeat of a burst (the one a short lease depends on).
//
//	go test -run '^$' -bench ExtendBurst -benchtime 20x ./store/idempgx
func BenchmarkExtendBurst(b *testing.B) {
	const leases = 300
	for _, mode := range []string{"shared", "alone"} {
		b.Run(mode, func(b *testing.B) {
			e := newExtendEnv(b, leases)
			if mode == "alone" {
				idempgx.ExtendAlone(e.s)
			}
			ctx := ctxT(b)
			var slowest time.Duration
			b.ResetTimer()
			for range b.N {
				var wg sync.WaitGroup
				var mu sync.Mutex
				var errs []error
				for key, token := range e.leases {
					wg.Go(func() {
						start := time.Now()
						_, err := e.s.Extend(ctx, "s", key, token, time.Minute)
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
					b.Fatal(fmt.Sprint(len(errs), " heartbeats failed: ", errs[0]))
				}
			}
			b.ReportMetric(float64(leases*b.N)/b.Elapsed().Seconds(), "heartbeats/s")
			b.ReportMetric(float64(slowest.Milliseconds()), "slowest-ms")
		})
	}
}
