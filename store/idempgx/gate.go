package idempgx

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ConnStats says how the store's calls waited for pool connections. The
// counters only grow, so a rate of HolderAcquireWait over HolderAcquires
// is the mean time a statement of heartbeats, completions or a release
// waited for a connection: if it grows, leases are at risk (raise the pool's MaxConns
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
	// took from the pool (one per statement: concurrent heartbeats, and
	// concurrent completions, share one), and HolderAcquireWait adds up
	// how long they waited for them.
	HolderAcquires    int64
	HolderAcquireWait time.Duration
}

// ConnStats returns a snapshot of the store's connection statistics.
func (s *Store) ConnStats() ConnStats {
	g := s.gate.Stats()
	return ConnStats{
		MaxConns:          s.maxConns,
		HolderConns:       s.cfg.HolderConns,
		GatedConns:        g.Slots,
		GatedWaiting:      g.Waiting,
		GatedWaits:        g.Waits,
		GatedWaitTime:     g.WaitTime,
		HolderAcquires:    s.holderAcquires.Load(),
		HolderAcquireWait: time.Duration(s.holderWaitNanos.Load()),
	}
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
	if err := s.gate.Enter(ctx); err != nil {
		return nil, fmt.Errorf("idempgx: %s: gave up waiting for one of the %d pool connections open to claims (%d of %d are kept for lease holders): %w",
			op, s.gate.Stats().Slots, s.cfg.HolderConns, s.maxConns, classify(err))
	}
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		s.gate.Leave()
		return nil, s.wrap(op, err)
	}
	return c, nil
}

// done gives back a connection taken with s.conn.
func (s *Store) done(c *pgxpool.Conn, holder bool) {
	c.Release()
	if !holder {
		s.gate.Leave()
	}
}
