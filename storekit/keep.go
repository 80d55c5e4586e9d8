package storekit

import (
	"context"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/keeper"
)

// Keeper keeps a lease (or a set of leases) alive while work runs under
// it: one heartbeat every Lease/3, never overlapping [Keeper.Exclusive]
// (recording the result), a lost lease reported once through
// KeeperConfig.OnLost, transient failures retried within the lease, and
// the count and slowest of the heartbeats kept for [idem.DoEvent]-style
// reporting ([Keeper.Stats]). It is the Guard's own heartbeat.
//
// Use:
//
//	runCtx, cancel := context.WithCancelCause(ctx)
//	defer cancel(nil)
//	k := storekit.Keep(ctx, storekit.KeeperConfig{
//		Lease:  lease,
//		Extend: func(ctx context.Context) error { return extendAll(ctx, leases) },
//		OnLost: cancel, // the work's context ends with a cause wrapping idem.ErrLeaseLost
//	})
//	err := work(runCtx)
//	if lost := k.Stop(); lost != nil { ... nothing may be recorded ... }
type Keeper = keeper.Keeper

// KeeperConfig configures [Keep]; see each field. ErrLost defaults to
// idem.ErrLeaseLost.
type KeeperConfig = keeper.Config

// Keep starts a [Keeper]. Extend must return an error wrapping
// idem.ErrLeaseLost (or cfg.ErrLost) when a lease is no longer held; any
// other error is retried at the next heartbeat until cfg.GiveUp (default:
// one lease) has passed without a successful one. ctx's values reach the
// heartbeats; its cancellation does not stop them: call Stop.
func Keep(ctx context.Context, cfg KeeperConfig) *Keeper {
	if cfg.ErrLost == nil {
		cfg.ErrLost = idem.ErrLeaseLost
	}
	return keeper.Start(ctx, cfg)
}
