package idemsqlite

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// TestShortLeaseSurvivesClaimStorm holds a key under a Guard with a 1 s
// lease for three leases while 100 goroutines claim the same key as fast
// as they can. Every conflicting claim must answer InProgress, the
// holder's heartbeat must keep getting through, and nobody else may
// acquire: the proxy's 1 s leases depend on it.
//
// The claim is about starvation (the storm's writes must not keep the
// heartbeat's out of the write queue), not about the disk: on a machine
// whose fsync'd commit alone takes more than a tenth of a second the
// lease is ten lone commits instead, so that a slow shared disk does not
// fail it while a starved heartbeat still would.
func TestShortLeaseSurvivesClaimStorm(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, nil)
	ctx := context.Background()
	const goroutines = 100
	lease := max(time.Second, 10*loneCommit(t, s))
	hold := 3 * lease
	fp := idem.FingerprintBytes([]byte("payment"))
	hb := &timedExtends{Store: s}
	g := idem.NewGuard(hb, &idem.GuardConfig{Lease: lease, Logger: quietLogger})

	started := make(chan struct{})
	stop := make(chan struct{})
	var (
		wg         sync.WaitGroup
		claims     atomic.Int64
		maxLatency atomic.Int64
		unexpected = make(chan string, goroutines)
	)
	for range goroutines {
		wg.Go(func() {
			<-started
			for {
				select {
				case <-stop:
					return
				default:
				}
				t0 := time.Now()
				c, err := s.Claim(ctx, idem.ClaimRequest{Scope: "storm", Key: "pay-1", Fingerprint: fp, Lease: lease})
				d := int64(time.Since(t0))
				for {
					m := maxLatency.Load()
					if d <= m || maxLatency.CompareAndSwap(m, d) {
						break
					}
				}
				claims.Add(1)
				switch {
				case err != nil:
					unexpected <- "claim error: " + err.Error()
					return
				case c.Outcome == idem.Acquired:
					unexpected <- "a competing claim acquired the key (takeover=" + boolText(c.Takeover) + ")"
					return
				case c.Outcome == idem.Completed:
					return
				case c.Outcome != idem.InProgress:
					unexpected <- "outcome " + c.Outcome.String()
					return
				}
			}
		})
	}
	res, err := g.Do(ctx, idem.Call{Scope: "storm", Key: "pay-1", Fingerprint: fp}, func(ctx context.Context, run idem.Run) ([]byte, error) {
		close(started)
		select {
		case <-time.After(hold):
			return []byte("charged"), nil
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	})
	close(stop)
	wg.Wait()
	close(unexpected)
	if err != nil {
		t.Errorf("holder lost its lease under the claim storm: %v", err)
	} else if string(res.Value) != "charged" || res.Replayed {
		t.Errorf("holder result = %+v", res)
	}
	for msg := range unexpected {
		t.Error(msg)
	}
	hb.mu.Lock()
	defer hb.mu.Unlock()
	t.Logf("%d conflicting claims in %v, slowest %v; %d heartbeats, slowest %v",
		claims.Load(), hold, time.Duration(maxLatency.Load()), hb.n, hb.slowest)
	for _, err := range hb.errs {
		t.Errorf("heartbeat failed: %v", err)
	}
	if hb.n < 2 {
		t.Errorf("%d heartbeats in %v with a %v lease, want at least 2", hb.n, hold, lease)
	}
	if claims.Load() < goroutines {
		t.Errorf("only %d claims ran: the storm did not happen", claims.Load())
	}
}

// loneCommit is the slowest of five lone claim + release round trips on
// s, each an fsync'd commit.
func loneCommit(t *testing.T, s *Store) time.Duration {
	t.Helper()
	ctx := context.Background()
	fp := idem.FingerprintBytes([]byte("probe"))
	var slowest time.Duration
	for range 5 {
		t0 := time.Now()
		c, err := s.Claim(ctx, idem.ClaimRequest{Scope: "probe", Key: "k", Fingerprint: fp, Lease: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Release(ctx, "probe", "k", c.Token); err != nil {
			t.Fatal(err)
		}
		slowest = max(slowest, time.Since(t0)/2)
	}
	t.Logf("slowest lone commit %v", slowest)
	return slowest
}

// timedExtends records how long the Guard's heartbeats take and how they
// fail.
type timedExtends struct {
	*Store
	mu      sync.Mutex
	n       int
	slowest time.Duration
	errs    []error
}

func (s *timedExtends) Extend(ctx context.Context, scope, key string, token int64, lease time.Duration) (time.Time, error) {
	t0 := time.Now()
	until, err := s.Store.Extend(ctx, scope, key, token, lease)
	d := time.Since(t0)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	s.slowest = max(s.slowest, d)
	if err != nil {
		s.errs = append(s.errs, err)
	}
	return until, err
}

func boolText(b bool) string {
	if b {
		return "true"
	}
	return "false"
}
