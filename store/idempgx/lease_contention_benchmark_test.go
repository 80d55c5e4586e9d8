package idempgx_test

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idempgx"
)

// Run with:
//
//	IDEM_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test?sslmode=disable \
//	  go test -run '^$' -bench 'Storm' -benchtime=200x ./store/idempgx/

// stormGoroutines is the burst of the proxy's bug report: 300 requests at
// once.
const stormGoroutines = 300

// BenchmarkExtendUnderClaimStorm is a lease holder's heartbeat while 300
// goroutines claim its key in a loop over a pool of four connections: what
// decides whether a lease survives a burst of retries. Before the holders'
// reserve the heartbeat queued in the pool behind the whole burst.
func BenchmarkExtendUnderClaimStorm(b *testing.B) {
	s, err := idempgx.New(ownPool(b, 4), &idempgx.Config{Schema: migratedSchema(b)})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	req := idem.ClaimRequest{Scope: "bench", Key: "held", Fingerprint: fp("body"), Lease: time.Hour}
	held, err := s.Claim(ctx, req)
	if err != nil || held.Outcome != idem.Acquired {
		b.Fatal(held, err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range stormGoroutines {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if c, err := s.Claim(ctx, req); err != nil || c.Outcome != idem.InProgress {
					b.Errorf("conflicting claim: %v %v", c.Outcome, err)
					return
				}
			}
		})
	}
	time.Sleep(100 * time.Millisecond) // let the storm build up
	var slowest, total time.Duration
	for b.Loop() {
		t0 := time.Now()
		if _, err := s.Extend(ctx, req.Scope, req.Key, held.Token, time.Hour); err != nil {
			b.Fatal(err)
		}
		d := time.Since(t0)
		slowest, total = max(slowest, d), total+d
	}
	close(stop)
	wg.Wait()
	b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "mean-ms")
	b.ReportMetric(float64(slowest.Microseconds())/1000, "max-ms")
}

// BenchmarkClaimStorm is the storm's own throughput (300 goroutines
// claiming a key in progress over four connections, three of them open
// to claims): what the reserve costs the claims.
func BenchmarkClaimStorm(b *testing.B) {
	s, err := idempgx.New(ownPool(b, 4), &idempgx.Config{Schema: migratedSchema(b)})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	req := idem.ClaimRequest{Scope: "bench", Key: "held", Fingerprint: fp("body"), Lease: time.Hour}
	if c, err := s.Claim(ctx, req); err != nil || c.Outcome != idem.Acquired {
		b.Fatal(c, err)
	}
	b.SetParallelism(max(1, stormGoroutines/runtime.GOMAXPROCS(0)))
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if c, err := s.Claim(ctx, req); err != nil || c.Outcome != idem.InProgress {
				b.Errorf("conflicting claim: %v %v", c.Outcome, err)
				return
			}
		}
	})
}
