package idemsqlite

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// Run side by side with:
//
//	go test -run '^$' -bench 'Conflict|Extend' -benchtime=2s

// heldKey claims a key for the whole benchmark, so every other claim on it
// is a conflict.
func heldKey(b *testing.B, s *Store) (idem.ClaimRequest, idem.Claim) {
	b.Helper()
	req := idem.ClaimRequest{Scope: "bench", Key: "held", Fingerprint: idem.FingerprintBytes([]byte("body")), Lease: time.Hour}
	c, err := s.Claim(context.Background(), req)
	if err != nil || c.Outcome != idem.Acquired {
		b.Fatalf("claim: %v %v", c.Outcome, err)
	}
	return req, c
}

func claimConflict(b *testing.B, s *Store, req idem.ClaimRequest) {
	c, err := s.Claim(context.Background(), req)
	if err != nil || c.Outcome != idem.InProgress {
		b.Errorf("conflicting claim: %v %v", c.Outcome, err)
	}
}

// BenchmarkClaimConflict is one claim at a time on a key in progress.
func BenchmarkClaimConflict(b *testing.B) {
	s := newBenchStore(b)
	req, _ := heldKey(b, s)
	for b.Loop() {
		claimConflict(b, s, req)
	}
}

// BenchmarkClaimConflictParallel is 100 goroutines (on GOMAXPROCS=2, 50 per
// P) claiming one key in progress, as a burst of retries does.
func BenchmarkClaimConflictParallel(b *testing.B) {
	s := newBenchStore(b)
	req, _ := heldKey(b, s)
	b.SetParallelism(50)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			claimConflict(b, s, req)
		}
	})
}

// BenchmarkExtendUnderClaimStorm is the lease holder's heartbeat while 100
// goroutines claim its key in a loop: what decides whether a short lease
// survives a burst of retries.
func BenchmarkExtendUnderClaimStorm(b *testing.B) {
	s := newBenchStore(b)
	req, held := heldKey(b, s)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 100 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
					claimConflict(b, s, req)
				}
			}
		})
	}
	time.Sleep(50 * time.Millisecond) // let the storm build up
	ctx := context.Background()
	var slowest time.Duration
	for b.Loop() {
		t0 := time.Now()
		if _, err := s.Extend(ctx, req.Scope, req.Key, held.Token, time.Hour); err != nil {
			b.Fatal(err)
		}
		slowest = max(slowest, time.Since(t0))
	}
	close(stop)
	wg.Wait()
	b.ReportMetric(float64(slowest.Microseconds())/1000, "max-ms")
}

// BenchmarkExtendIdle is the heartbeat with nobody else on the store: the
// floor for BenchmarkExtendUnderClaimStorm (one fsync per commit).
func BenchmarkExtendIdle(b *testing.B) {
	s := newBenchStore(b)
	req, held := heldKey(b, s)
	ctx := context.Background()
	for b.Loop() {
		if _, err := s.Extend(ctx, req.Scope, req.Key, held.Token, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
}
