package idemmysql

import (
	"context"
	"fmt"
	"time"
)

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
	g := s.gate.Stats()
	return ConnStats{MaxConns: s.maxConns, HolderConns: s.cfg.HolderConns,
		GatedConns: g.Slots, GatedWaiting: g.Waiting, GatedWaits: g.Waits, GatedWaitTime: g.WaitTime}
}

// gated runs fn, a call other than a lease holder's, holding a slot of the
// gate.
func (s *Store) gated(ctx context.Context, op string, fn func() error) error {
	if err := s.gate.Enter(ctx); err != nil {
		return fmt.Errorf("idemmysql: %s: gave up waiting for one of the %d connections open to claims (%d of %d are kept for lease holders): %w",
			op, s.gate.Stats().Slots, s.cfg.HolderConns, s.maxConns, classify(err))
	}
	defer s.gate.Leave()
	return fn()
}
