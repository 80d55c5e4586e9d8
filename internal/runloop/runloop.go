// Package runloop is the lifecycle the inbox worker and the outbox relay
// share: loops that claim batches from a table and run them, a purge loop,
// Start once, a graceful Stop (claim nothing more, let the loops finish,
// bounded by a context) that turns hard (cancel the loops' context) when
// its context ends, and Run until a context ends.
//
// What is done with a claimed batch (run handlers under heartbeats,
// publish and record) stays with the worker and the relay.
package runloop

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/idem-go/idem"
)

// Group runs the loops of one worker or relay.
type Group struct {
	pkg, noun string        // "inbox", "worker": error and log texts
	wake      chan struct{} // nil unless the loops can be woken

	mu       sync.Mutex
	started  bool
	stopping chan struct{} // closed by Stop: claim nothing more
	hardStop context.CancelFunc
	wg       sync.WaitGroup
}

// New returns a group for a pkg ("inbox", "outbox") noun ("worker",
// "relay"). wakeable gives it a channel of n wake-ups for [Group.Wake]; 0
// means the loops only poll.
func New(pkg, noun string, wakeable int) *Group {
	g := &Group{pkg: pkg, noun: noun, stopping: make(chan struct{})}
	if wakeable > 0 {
		g.wake = make(chan struct{}, wakeable)
	}
	return g
}

// Locked runs fn under the group's lock, with whether it was started:
// registration that must happen before Start uses it.
func (g *Group) Locked(fn func(started bool) error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return fn(g.started)
}

// Start launches loops, each with a context that ctx's end, or a hard
// stop, cancels. A group starts once.
func (g *Group) Start(ctx context.Context, loops ...func(ctx context.Context)) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.started {
		return fmt.Errorf("%w: %s: %s already started", idem.ErrInvalidConfig, g.pkg, g.noun)
	}
	g.started = true
	var runCtx context.Context
	runCtx, g.hardStop = context.WithCancel(ctx)
	for _, loop := range loops {
		g.wg.Go(func() { loop(runCtx) })
	}
	return nil
}

// Stop stops claiming and waits for the loops. If ctx ends first, the
// loops' context is cancelled and Stop returns ctx's error once they have
// exited.
func (g *Group) Stop(ctx context.Context) error {
	g.mu.Lock()
	if !g.started {
		g.mu.Unlock()
		return nil
	}
	select {
	case <-g.stopping:
	default:
		close(g.stopping)
	}
	g.mu.Unlock()
	done := make(chan struct{})
	go func() { g.wg.Wait(); close(done) }()
	select {
	case <-done:
		g.hardStop()
		return nil
	case <-ctx.Done():
		g.hardStop()
		<-done
		return fmt.Errorf("%s: stop: %w", g.pkg, ctx.Err())
	}
}

// Run calls start, blocks until ctx is done, then stops gracefully within
// shutdown.
func (g *Group) Run(ctx context.Context, start func(context.Context) error, shutdown time.Duration) error {
	if err := start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdown)
	defer cancel()
	return g.Stop(sctx)
}

// Stopping reports whether Stop was called.
func (g *Group) Stopping() bool {
	select {
	case <-g.stopping:
		return true
	default:
		return false
	}
}

// StopSignal is closed when Stop is called.
func (g *Group) StopSignal() <-chan struct{} { return g.stopping }

// Wake wakes up to n idle loops; it never blocks.
func (g *Group) Wake(n int) {
	for range n {
		select {
		case g.wake <- struct{}{}:
		default:
			return
		}
	}
}

// Idle waits d (or a wake-up), returning false when the group stops or ctx
// ends meanwhile.
func (g *Group) Idle(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-g.wake: // nil: never
		return true
	case <-g.stopping:
		return false
	case <-ctx.Done():
		return false
	}
}

// Claims is one claiming loop: until the group stops or ctx ends, claim a
// batch of at most limit rows and run it; wait poll after a failed claim
// (logged) or a batch smaller than limit.
func Claims[R any](ctx context.Context, g *Group, log *slog.Logger, limit int, poll time.Duration,
	claim func(context.Context) ([]R, error), run func(context.Context, []R)) {
	for !g.Stopping() && ctx.Err() == nil {
		rows, err := claim(ctx)
		if err != nil {
			if ctx.Err() == nil {
				log.WarnContext(ctx, g.pkg+": claim failed", "err", err)
			}
			if !g.Idle(ctx, poll) {
				return
			}
			continue
		}
		run(ctx, rows)
		if len(rows) < limit && !g.Idle(ctx, poll) {
			return
		}
	}
}

// Purges is the purge loop: every interval until the group stops or ctx
// ends, purge; a failure is logged as a warning, rows deleted at debug
// level with done ("purged sent events") and unit ("events").
func (g *Group) Purges(ctx context.Context, log *slog.Logger, every time.Duration, done, unit string,
	purge func(context.Context) (int64, error)) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-g.stopping:
			return
		case <-t.C:
		}
		n, err := purge(ctx)
		if err != nil && ctx.Err() == nil {
			log.WarnContext(ctx, g.pkg+": purge failed", "err", err)
		} else if n > 0 {
			log.DebugContext(ctx, g.pkg+": "+done, unit, n)
		}
	}
}
