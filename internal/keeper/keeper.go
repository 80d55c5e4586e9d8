// Package keeper is the one lease keeper (heartbeat loop) of the module: it
// extends a lease, or a set of leases, every Lease/3 while work runs under
// it. The Guard uses it directly; other modules reach it through
// storekit.Keep.
package keeper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// Config configures a [Keeper].
type Config struct {
	// Lease is the lease being kept. A heartbeat is sent every Lease/3, each
	// bounded by Lease/3. Required (positive).
	Lease time.Duration
	// Extend sends one heartbeat: it extends the lease (or all the leases)
	// to now + Lease. Its ctx is detached from the caller's cancellation
	// and times out after Lease/3. An error wrapping ErrLost means the lease
	// is gone for good; any other error is transient and the next heartbeat
	// tries again. Required.
	Extend func(ctx context.Context) error
	// ErrLost is the sentinel of a lost lease (idem.ErrLeaseLost). Required.
	ErrLost error
	// GiveUp is how long heartbeats may fail before the lease counts as
	// lost (the store was unreachable, so another caller may have taken
	// over). Zero means Lease; negative means never: transient failures are
	// only logged.
	GiveUp time.Duration
	// OnLost is called once, from the keeper's goroutine, when the lease is
	// found lost, with the cause (an error wrapping ErrLost): cancel the
	// work there. Optional.
	OnLost func(cause error)
	// Logger receives failed and slow heartbeats. Default slog.Default().
	Logger *slog.Logger
	// LogPrefix starts every log message ("idem", "idemredis: process
	// batch"). Default "idem".
	LogPrefix string
	// LogArgs are added to every log record (e.g. "scope", s, "key", k).
	LogArgs []any
}

// Keeper sends the heartbeats of one lease (or set of leases) until it is
// stopped, the lease is lost, or the work under it is finished. Its
// guarantees:
//
//   - heartbeats never overlap each other, nor a function run with
//     [Keeper.Exclusive] (recording the result): a heartbeat sent after the
//     record is written would find the lease gone;
//   - a lost lease (ErrLost from Extend, or failures for GiveUp) calls
//     OnLost once and ends the keeper;
//   - transient failures are retried at the next tick, within the lease;
//   - the number of heartbeats and the slowest one are counted ([Keeper.Stats]).
type Keeper struct {
	cfg  Config
	quit chan struct{}
	done chan struct{} // closed when the goroutine ends
	stop sync.Once

	// mu is held by each heartbeat and by each Exclusive function.
	mu       sync.Mutex
	finished bool

	// smu guards what the heartbeats found, so that reading it never waits
	// for a heartbeat in flight.
	smu     sync.Mutex
	lost    error
	count   int
	slowest time.Duration
}

// Start starts keeping the lease. ctx carries the values of the heartbeats'
// contexts (its cancellation does not stop them: call Stop). It panics on
// a Config without Lease, Extend or ErrLost, a programming error.
func Start(ctx context.Context, cfg Config) *Keeper {
	if cfg.Lease <= 0 || cfg.Extend == nil || cfg.ErrLost == nil {
		panic("keeper: Config needs a positive Lease, Extend and ErrLost")
	}
	if cfg.GiveUp == 0 {
		cfg.GiveUp = cfg.Lease
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.LogPrefix == "" {
		cfg.LogPrefix = "idem"
	}
	k := &Keeper{cfg: cfg, quit: make(chan struct{}), done: make(chan struct{})}
	go k.loop(context.WithoutCancel(ctx))
	return k
}

func (k *Keeper) loop(ctx context.Context) {
	defer close(k.done)
	every := k.cfg.Lease / 3
	// The local deadline uses the monotonic clock: if the store cannot be
	// reached for GiveUp, assume another caller took over.
	deadline := time.Now().Add(k.cfg.GiveUp)
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	for {
		select {
		case <-k.quit:
			return
		case <-ticker.C:
		}
		k.mu.Lock()
		if k.finished {
			k.mu.Unlock()
			return
		}
		ectx, cancel := context.WithTimeout(ctx, every)
		sent := time.Now()
		err := k.cfg.Extend(ectx)
		cancel()
		took := time.Since(sent)
		var cause error
		switch {
		case err == nil:
			deadline = sent.Add(k.cfg.GiveUp)
		case errors.Is(err, k.cfg.ErrLost):
			cause = err
		case k.cfg.GiveUp > 0 && !time.Now().Before(deadline):
			cause = fmt.Errorf("%w: store unreachable for a whole lease: %w", k.cfg.ErrLost, err)
		}
		k.smu.Lock()
		k.count++
		k.slowest = max(k.slowest, took)
		k.lost = cause
		k.smu.Unlock()
		k.mu.Unlock()

		if took >= every {
			k.cfg.Logger.WarnContext(ctx, k.cfg.LogPrefix+": lease heartbeat is slow for the lease; the lease may expire while the work runs",
				append([]any{"took", took, "lease", k.cfg.Lease}, k.cfg.LogArgs...)...)
		}
		if err != nil && cause == nil {
			k.cfg.Logger.WarnContext(ctx, k.cfg.LogPrefix+": lease heartbeat failed", append([]any{"err", err}, k.cfg.LogArgs...)...)
		}
		if cause != nil {
			if k.cfg.OnLost != nil {
				k.cfg.OnLost(cause)
			}
			return
		}
	}
}

// Exclusive runs fn while no heartbeat is in flight, and none starts until
// fn returns. When fn reports last (the result is recorded, or given up),
// no heartbeat is sent after it and the keeper ends.
func (k *Keeper) Exclusive(fn func() (last bool)) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if fn() {
		k.finished = true
	}
}

// Done is closed when the keeper has ended: stopped, lease lost, or
// finished by [Keeper.Exclusive].
func (k *Keeper) Done() <-chan struct{} { return k.done }

// Lost returns the cause if the lease was found lost so far, or nil. It
// does not wait.
func (k *Keeper) Lost() error {
	k.smu.Lock()
	defer k.smu.Unlock()
	return k.lost
}

// Stop ends the heartbeats, waits for one in flight, and returns the cause
// if the lease was lost, or nil. It may be called more than once.
func (k *Keeper) Stop() error {
	k.stop.Do(func() { close(k.quit) })
	<-k.done
	return k.Lost()
}

// Stats returns how many heartbeats were sent and how long the slowest
// took (including failed ones).
func (k *Keeper) Stats() (count int, slowest time.Duration) {
	k.smu.Lock()
	defer k.smu.Unlock()
	return k.count, k.slowest
}
