package keeper_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/keeper"
)

var errLost = errors.New("lease lost")

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func start(t *testing.T, cfg keeper.Config) *keeper.Keeper {
	t.Helper()
	if cfg.Lease == 0 {
		cfg.Lease = 60 * time.Millisecond
	}
	cfg.ErrLost = errLost
	cfg.Logger = quiet
	k := keeper.Start(context.Background(), cfg)
	t.Cleanup(func() { k.Stop() })
	return k
}

func TestKeeperExtendsUntilStopped(t *testing.T) {
	var n atomic.Int32
	k := start(t, keeper.Config{Extend: func(ctx context.Context) error {
		if _, ok := ctx.Deadline(); !ok {
			t.Error("heartbeat context has no deadline")
		}
		n.Add(1)
		return nil
	}})
	time.Sleep(150 * time.Millisecond)
	if err := k.Stop(); err != nil {
		t.Fatalf("Stop = %v, want nil", err)
	}
	sent := n.Load()
	if sent < 3 {
		t.Fatalf("%d heartbeats in 150ms at a 20ms interval", sent)
	}
	time.Sleep(50 * time.Millisecond)
	if n.Load() != sent {
		t.Fatal("heartbeats after Stop")
	}
	if count, _ := k.Stats(); count != int(sent) {
		t.Fatalf("Stats count %d, Extend called %d times", count, sent)
	}
	if err := k.Stop(); err != nil {
		t.Fatalf("second Stop = %v", err)
	}
}

func TestKeeperIgnoresCallerCancellation(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var n atomic.Int32
	k := keeper.Start(ctx, keeper.Config{Lease: 30 * time.Millisecond, ErrLost: errLost, Logger: quiet,
		Extend: func(ctx context.Context) error {
			if ctx.Err() == nil {
				n.Add(1)
			}
			return nil
		}})
	time.Sleep(60 * time.Millisecond)
	k.Stop()
	if n.Load() == 0 {
		t.Fatal("no live heartbeat under a cancelled caller context")
	}
}

func TestKeeperLostLease(t *testing.T) {
	var calls atomic.Int32
	var causes []error
	var mu sync.Mutex
	k := start(t, keeper.Config{
		Extend: func(context.Context) error {
			calls.Add(1)
			return errors.Join(errors.New("token 7"), errLost)
		},
		OnLost: func(err error) { mu.Lock(); causes = append(causes, err); mu.Unlock() },
	})
	select {
	case <-k.Done():
	case <-time.After(time.Second):
		t.Fatal("keeper did not end on a lost lease")
	}
	if err := k.Lost(); !errors.Is(err, errLost) {
		t.Fatalf("Lost = %v", err)
	}
	if err := k.Stop(); !errors.Is(err, errLost) {
		t.Fatalf("Stop = %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(causes) != 1 || !errors.Is(causes[0], errLost) || calls.Load() != 1 {
		t.Fatalf("OnLost called with %v after %d heartbeats, want once after 1", causes, calls.Load())
	}
}

func TestKeeperRetriesTransientFailures(t *testing.T) {
	var n atomic.Int32
	k := start(t, keeper.Config{Lease: 90 * time.Millisecond, Extend: func(context.Context) error {
		if n.Add(1)%2 == 1 {
			return errors.New("connection reset")
		}
		return nil
	}})
	time.Sleep(300 * time.Millisecond)
	if err := k.Stop(); err != nil {
		t.Fatalf("Stop = %v: one failure in two stays within the lease", err)
	}
}

func TestKeeperGivesUpWhenUnreachableForALease(t *testing.T) {
	boom := errors.New("connection refused")
	var lost atomic.Value
	k := start(t, keeper.Config{
		Extend: func(context.Context) error { return boom },
		OnLost: func(err error) { lost.Store(err) },
	})
	select {
	case <-k.Done():
	case <-time.After(time.Second):
		t.Fatal("keeper did not give up")
	}
	err, _ := lost.Load().(error)
	if !errors.Is(err, errLost) || !errors.Is(err, boom) {
		t.Fatalf("cause %v: want lost, wrapping the last failure", err)
	}
}

func TestKeeperNeverGivesUp(t *testing.T) {
	k := start(t, keeper.Config{GiveUp: -1, Extend: func(context.Context) error { return errors.New("down") }})
	time.Sleep(150 * time.Millisecond)
	if err := k.Stop(); err != nil {
		t.Fatalf("Stop = %v, want nil with GiveUp < 0", err)
	}
}

// A heartbeat never overlaps an Exclusive function, and none is sent after
// one that reports last.
func TestKeeperExclusive(t *testing.T) {
	var inside, overlaps, after atomic.Int32
	var finished atomic.Bool
	k := start(t, keeper.Config{Lease: 30 * time.Millisecond, Extend: func(context.Context) error {
		if inside.Load() != 0 {
			overlaps.Add(1)
		}
		if finished.Load() {
			after.Add(1)
		}
		time.Sleep(5 * time.Millisecond)
		return nil
	}})
	for range 5 {
		k.Exclusive(func() bool {
			inside.Add(1)
			time.Sleep(25 * time.Millisecond)
			inside.Add(-1)
			return false
		})
	}
	k.Exclusive(func() bool { finished.Store(true); return true })
	select {
	case <-k.Done():
	case <-time.After(time.Second):
		t.Fatal("keeper did not end after the last Exclusive")
	}
	if overlaps.Load() != 0 || after.Load() != 0 {
		t.Fatalf("%d heartbeats overlapped Exclusive, %d came after the last", overlaps.Load(), after.Load())
	}
	if err := k.Stop(); err != nil {
		t.Fatalf("Stop = %v", err)
	}
}

func TestKeeperReportsSlowest(t *testing.T) {
	k := start(t, keeper.Config{Extend: func(context.Context) error {
		time.Sleep(10 * time.Millisecond)
		return nil
	}})
	time.Sleep(70 * time.Millisecond)
	k.Stop()
	count, slowest := k.Stats()
	if count < 1 || slowest < 10*time.Millisecond {
		t.Fatalf("Stats = %d, %v", count, slowest)
	}
}

func TestKeeperRejectsIncompleteConfig(t *testing.T) {
	for name, cfg := range map[string]keeper.Config{
		"no lease":   {Extend: func(context.Context) error { return nil }, ErrLost: errLost},
		"no extend":  {Lease: time.Second, ErrLost: errLost},
		"no errlost": {Lease: time.Second, Extend: func(context.Context) error { return nil }},
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("Start did not panic")
				}
			}()
			keeper.Start(context.Background(), cfg)
		})
	}
}
