package storekit_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/storekit"
)

// TestGateBounds: 32 goroutines through a gate of 3 never hold more than 3
// slots at once, and the waits are counted.
func TestGateBounds(t *testing.T) {
	t.Parallel()
	g := storekit.NewGate(3)
	var in, peak atomic.Int64
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := g.Enter(context.Background()); err != nil {
				t.Error(err)
				return
			}
			n := in.Add(1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			time.Sleep(time.Millisecond)
			in.Add(-1)
			g.Leave()
		}()
	}
	wg.Wait()
	st := g.Stats()
	if peak.Load() > 3 || peak.Load() == 0 || st.Slots != 3 || st.Waiting != 0 || st.Waits == 0 || st.WaitTime <= 0 {
		t.Fatalf("peak %d, stats %+v", peak.Load(), st)
	}
}

func TestGateGivesUpWithTheCause(t *testing.T) {
	t.Parallel()
	g := storekit.NewGate(1)
	if err := g.Enter(context.Background()); err != nil {
		t.Fatal(err)
	}
	stop := errors.New("shutting down")
	ctx, cancel := context.WithCancelCause(context.Background())
	go func() {
		for g.Stats().Waiting == 0 {
			time.Sleep(time.Millisecond)
		}
		cancel(stop)
	}()
	if err := g.Enter(ctx); !errors.Is(err, stop) {
		t.Fatalf("Enter on a full gate = %v, want the context's cause", err)
	}
	g.Leave()
	if err := g.Enter(context.Background()); err != nil {
		t.Fatalf("Enter after Leave = %v", err)
	}
	var none *storekit.Gate // no limit: every call passes
	if err := none.Enter(ctx); err != nil || none.Stats() != (storekit.GateStats{}) {
		t.Fatalf("nil gate: %v, %+v", err, none.Stats())
	}
	none.Leave()
}

func TestHolderConns(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		cfg, max, want int
		err            string
	}{
		{0, 20, 5, ""}, {0, 4, 1, ""}, {0, 1, 0, ""}, {0, 0, 0, ""}, {3, 4, 3, ""}, {5, 0, 0, ""},
		{-1, 4, 0, "HolderConns must not be negative, got -1"},
		{4, 4, 0, "HolderConns 4 leaves none of the pool's 4 connections (MaxConns) to claims; want at most 3"},
	} {
		got, err := storekit.HolderConns(c.cfg, c.max, "MaxConns")
		if got != c.want || (err == nil) != (c.err == "") || err != nil && err.Error() != c.err {
			t.Errorf("HolderConns(%d, %d) = %d, %v; want %d, %q", c.cfg, c.max, got, err, c.want, c.err)
		}
	}
}
