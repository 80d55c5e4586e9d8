package storekit

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
)

// Gate bounds how many of a connection pool's connections a store's calls
// other than a lease holder's (Claim, Get, Delete, Purge, List) hold at
// once, so that the rest of the pool stays free for Extend, Complete and
// Release. A burst of claims queues here, in Go, instead of in the pool's
// first-come queue, where a heartbeat would wait behind all of it, and
// behind claims stuck on a row lock. idempgx and idemmysql use it.
//
// A nil *Gate (a pool with no connection limit) lets every call through.
type Gate struct {
	slots chan struct{}

	waiting   atomic.Int64 // calls waiting for a slot now
	waits     atomic.Int64 // calls that found no free slot
	waitNanos atomic.Int64 // their total wait
}

// NewGate returns a Gate of n slots.
func NewGate(n int) *Gate { return &Gate{slots: make(chan struct{}, n)} }

// Enter takes a slot, waiting until ctx ends; it returns
// context.Cause(ctx) when it gave up. Every Enter that returns nil must be
// followed by one Leave.
func (g *Gate) Enter(ctx context.Context) error {
	if g == nil {
		return nil
	}
	select {
	case g.slots <- struct{}{}:
		return nil
	default:
	}
	g.waiting.Add(1)
	start := time.Now()
	defer func() {
		g.waiting.Add(-1)
		g.waits.Add(1)
		g.waitNanos.Add(int64(time.Since(start)))
	}()
	select {
	case g.slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// Leave gives back the slot an Enter took.
func (g *Gate) Leave() {
	if g != nil {
		<-g.slots
	}
}

// GateStats is a snapshot of a Gate: its slots, the calls waiting for one
// now, and how many calls had to wait and for how long in all (those two
// only grow).
type GateStats struct {
	Slots    int
	Waiting  int64
	Waits    int64
	WaitTime time.Duration
}

// Stats returns a snapshot of g (zero for a nil Gate).
func (g *Gate) Stats() GateStats {
	if g == nil {
		return GateStats{}
	}
	return GateStats{Slots: cap(g.slots), Waiting: g.waiting.Load(), Waits: g.waits.Load(),
		WaitTime: time.Duration(g.waitNanos.Load())}
}

// HolderConns works out how many of a pool's maxConns connections to keep
// for lease holders: cfg, where 0 means the default (a quarter of the
// pool, at least one), and none when the pool has a single connection or
// no limit (maxConns 0). limitName names the pool's setting in errors
// ("MaxConns", "SetMaxOpenConns").
func HolderConns(cfg, maxConns int, limitName string) (int, error) {
	switch {
	case cfg < 0:
		return 0, fmt.Errorf("HolderConns must not be negative, got %d", cfg)
	case maxConns == 0:
		return 0, nil
	case cfg == 0 && maxConns == 1:
		return 0, nil
	case cfg == 0:
		return max(1, maxConns/4), nil
	case cfg >= maxConns:
		return 0, fmt.Errorf("HolderConns %d leaves none of the pool's %d connections (%s) to claims; want at most %d",
			cfg, maxConns, limitName, maxConns-1)
	}
	return cfg, nil
}
