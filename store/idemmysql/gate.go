package idemmysql

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
)

// connGate bounds how many of the *sql.DB's connections the store's calls
// other than a lease holder's (Claim, Get, Delete, Purge) hold at once, so
// that the rest stay free for Extend, Complete and Release. A burst of
// claims queues here, in Go, instead of in database/sql's queue, where a
// heartbeat would wait behind all of it, and behind claims stuck on a row
// lock.
type connGate struct {
	slots chan struct{}

	waiting   atomic.Int64 // calls waiting for a slot now
	waits     atomic.Int64 // calls that found no free slot
	waitNanos atomic.Int64 // their total wait
}

// enter takes a slot, waiting until ctx ends. A nil gate (a pool without
// a connection limit) lets every call through.
func (g *connGate) enter(ctx context.Context, op string, holders, maxConns int) error {
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
		return fmt.Errorf("idemmysql: %s: gave up waiting for one of the %d connections open to claims (%d of %d are kept for lease holders): %w",
			op, cap(g.slots), holders, maxConns, classify(context.Cause(ctx)))
	}
}

func (g *connGate) leave() {
	if g != nil {
		<-g.slots
	}
}

// ConnStats says how the store's calls other than a lease holder's waited
// for one of the connections open to them. [sql.DB.Stats] has the pool's
// own view (WaitCount, WaitDuration).
type ConnStats struct {
	// MaxConns is the *sql.DB's MaxOpenConnections when the store was made
	// (0: unlimited, and nothing is gated), HolderConns how many of them
	// Claim, Get, Delete and Purge leave to lease holders, and GatedConns
	// (MaxConns - HolderConns) how many those calls use at most at once.
	MaxConns, HolderConns, GatedConns int
	// GatedWaiting is how many Claim, Get, Delete and Purge calls wait for
	// one of the GatedConns now; GatedWaits counts the calls that had to
	// wait and GatedWaitTime adds up their waits.
	GatedWaiting  int64
	GatedWaits    int64
	GatedWaitTime time.Duration
}

// ConnStats returns a snapshot of the store's connection statistics.
func (s *Store) ConnStats() ConnStats {
	st := ConnStats{MaxConns: s.maxConns, HolderConns: s.cfg.HolderConns}
	if s.gate != nil {
		st.GatedConns = cap(s.gate.slots)
		st.GatedWaiting = s.gate.waiting.Load()
		st.GatedWaits = s.gate.waits.Load()
		st.GatedWaitTime = time.Duration(s.gate.waitNanos.Load())
	}
	return st
}

// holderConns works out how many of a pool's maxConns connections to keep
// for lease holders: cfg, where 0 means the default (a quarter of the pool,
// at least one), and none when the pool has a single connection or no
// limit.
func holderConns(cfg, maxConns int) (int, error) {
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
		return 0, fmt.Errorf("HolderConns %d leaves none of the pool's %d connections (SetMaxOpenConns) to claims; want at most %d",
			cfg, maxConns, maxConns-1)
	}
	return cfg, nil
}

// gated runs fn, a call other than a lease holder's, holding a slot of the
// gate.
func (s *Store) gated(ctx context.Context, op string, fn func() error) error {
	if err := s.gate.enter(ctx, op, s.cfg.HolderConns, s.maxConns); err != nil {
		return err
	}
	defer s.gate.leave()
	return fn()
}
