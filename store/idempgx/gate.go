package idempgx

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// connGate bounds how many pool connections the store's calls other than
// a lease holder's (Claim, Get, Delete, Purge) hold at once, so that the
// rest of the pool stays free for Extend, Complete and Release. A burst of
// claims queues here, in Go, instead of in the pool's first-come queue,
// where a heartbeat would have waited behind all of it.
type connGate struct {
	slots chan struct{}

	waiting   atomic.Int64 // calls waiting for a slot now
	waits     atomic.Int64 // calls that found no free slot
	waitNanos atomic.Int64 // their total wait
}

func newConnGate(n int) *connGate { return &connGate{slots: make(chan struct{}, n)} }

// enter takes a slot, waiting until ctx ends; it returns context.Cause(ctx)
// when it gave up.
func (g *connGate) enter(ctx context.Context) error {
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

func (g *connGate) leave() { <-g.slots }

// ConnStats says how the store's calls waited for pool connections. The
// counters only grow, so a rate of HolderAcquireWait over HolderAcquires
// is the mean time a heartbeat, completion or release waited for a
// connection: if it grows, leases are at risk (raise the pool's MaxConns
// or [Config].HolderConns). [pgxpool.Pool.Stat] has the pool's own view.
type ConnStats struct {
	// MaxConns is the pool's MaxConns, HolderConns how many of them
	// Claim, Get, Delete and Purge leave to lease holders, and GatedConns
	// (MaxConns - HolderConns) how many those calls use at most at once.
	MaxConns, HolderConns, GatedConns int
	// GatedWaiting is how many Claim, Get, Delete and Purge calls wait for
	// one of the GatedConns now; GatedWaits counts the calls that had to
	// wait and GatedWaitTime adds up their waits.
	GatedWaiting  int64
	GatedWaits    int64
	GatedWaitTime time.Duration
	// HolderAcquires counts the connections Extend, Complete and Release
	// took from the pool, and HolderAcquireWait adds up how long they
	// waited for them.
	HolderAcquires    int64
	HolderAcquireWait time.Duration
}

// ConnStats returns a snapshot of the store's connection statistics.
func (s *Store) ConnStats() ConnStats {
	return ConnStats{
		MaxConns:          s.maxConns,
		HolderConns:       s.cfg.HolderConns,
		GatedConns:        cap(s.gate.slots),
		GatedWaiting:      s.gate.waiting.Load(),
		GatedWaits:        s.gate.waits.Load(),
		GatedWaitTime:     time.Duration(s.gate.waitNanos.Load()),
		HolderAcquires:    s.holderAcquires.Load(),
		HolderAcquireWait: time.Duration(s.holderWaitNanos.Load()),
	}
}

// holderConns works out how many of a pool's maxConns connections to keep
// for lease holders: cfg, where 0 means the default (a quarter of the pool,
// at least one), and none when the pool has a single connection.
func holderConns(cfg, maxConns int) (int, error) {
	switch {
	case cfg < 0:
		return 0, fmt.Errorf("HolderConns must not be negative, got %d", cfg)
	case cfg == 0 && maxConns == 1:
		return 0, nil
	case cfg == 0:
		return max(1, maxConns/4), nil
	case cfg >= maxConns:
		return 0, fmt.Errorf("HolderConns %d leaves none of the pool's %d connections (MaxConns) to claims; want at most %d",
			cfg, maxConns, maxConns-1)
	}
	return cfg, nil
}

// conn takes a pool connection for op. A lease holder's call (Extend,
// Complete, Release) goes straight to the pool, where the connections the
// gate keeps from everyone else are left for it; any other call first
// waits for a slot of the gate. Give the connection back with s.done.
func (s *Store) conn(ctx context.Context, op string, holder bool) (*pgxpool.Conn, error) {
	if holder {
		start := time.Now()
		c, err := s.pool.Acquire(ctx)
		s.holderAcquires.Add(1)
		s.holderWaitNanos.Add(int64(time.Since(start)))
		if err != nil {
			return nil, s.wrap(op, err)
		}
		return c, nil
	}
	if err := s.gate.enter(ctx); err != nil {
		return nil, fmt.Errorf("idempgx: %s: gave up waiting for one of the %d pool connections open to claims (%d of %d are kept for lease holders): %w",
			op, cap(s.gate.slots), s.cfg.HolderConns, s.maxConns, classify(err))
	}
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		s.gate.leave()
		return nil, s.wrap(op, err)
	}
	return c, nil
}

// done gives back a connection taken with s.conn.
func (s *Store) done(c *pgxpool.Conn, holder bool) {
	c.Release()
	if !holder {
		s.gate.leave()
	}
}
