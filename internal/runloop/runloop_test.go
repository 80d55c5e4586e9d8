package runloop

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

func TestLifecycle(t *testing.T) {
	g := New("outbox", "relay", 2)
	if err := g.Stop(context.Background()); err != nil { // never started
		t.Fatal(err)
	}
	var claims, runs atomic.Int64
	claim := func(ctx context.Context) ([]int, error) {
		if claims.Add(1)%2 == 0 {
			return nil, errors.New("claim fails")
		}
		return []int{1}, nil
	}
	run := func(ctx context.Context, rows []int) { runs.Add(int64(len(rows))) }
	log := slog.New(slog.DiscardHandler)
	loop := func(ctx context.Context) { Claims(ctx, g, log, 1, time.Hour, claim, run) }
	purged := make(chan struct{}, 1)
	purge := func(ctx context.Context) {
		g.Purges(ctx, log, time.Millisecond, "purged", "rows", func(context.Context) (int64, error) {
			select {
			case purged <- struct{}{}:
			default:
			}
			return 1, nil
		})
	}
	if err := g.Start(context.Background(), loop, purge); err != nil {
		t.Fatal(err)
	}
	if err := g.Start(context.Background()); !errors.Is(err, idem.ErrInvalidConfig) || !strings.Contains(err.Error(), "outbox: relay already started") {
		t.Fatalf("second Start: %v", err)
	}
	if err := g.Locked(func(started bool) error {
		if !started {
			return errors.New("not started")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	<-purged
	for runs.Load() < 2 { // a full batch claims again at once; a failed claim waits for a wake-up
		g.Wake(5)
		time.Sleep(time.Millisecond)
	}
	if err := g.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !g.Stopping() {
		t.Fatal("not stopping after Stop")
	}
}

func TestStopBounded(t *testing.T) {
	g := New("inbox", "worker", 0)
	if err := g.Start(context.Background(), func(ctx context.Context) { <-ctx.Done() }); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := g.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) || !strings.HasPrefix(err.Error(), "inbox: stop: ") {
		t.Fatalf("Stop: %v", err)
	}
}

func TestRun(t *testing.T) {
	g := New("inbox", "worker", 0)
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	done := make(chan error)
	go func() {
		done <- g.Run(ctx, func(ctx context.Context) error {
			defer close(started)
			return g.Start(ctx, func(ctx context.Context) { <-g.StopSignal() })
		}, time.Second)
	}()
	<-started
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
