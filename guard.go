package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/idem-go/idem/internal/keeper"
	"github.com/idem-go/idem/internal/textcut"
)

// GuardConfig configures a [Guard]. The zero value, and a nil pointer, mean
// the defaults documented on each field.
type GuardConfig struct {
	// Lease is how long a claim holds the key before another caller may take
	// over. The Guard extends it every Lease/3 while fn runs. Default 30s;
	// values under [MinLease] are raised to it.
	Lease time.Duration
	// Retention is how long a completed result is kept and replayed.
	// Default 24h. A positive Call.Retention overrides it for one call.
	Retention time.Duration
	// Wait, when positive, makes Do wait up to this long for an in-progress
	// operation to finish and then replay its result, instead of returning
	// ErrInProgress at once.
	Wait time.Duration
	// MaxErrorBytes bounds the text of a [Final] error that is recorded.
	// Default 1024.
	MaxErrorBytes int
	// Logger receives heartbeat and cleanup failures. Default slog.Default().
	Logger *slog.Logger
	// Hooks observe every Do: those implementing [DoStartHook] are called
	// as it starts, those implementing [DoEndHook] once at its end (also
	// when fn panics, before the panic goes on). contrib/idemotel
	// implements both, contrib/idemprom the end hook.
	Hooks []Hook
}

// DoEvent reports one [Guard.Do] call to its hooks. Scope and Key
// are the caller's: fine for logs and traces, never for metric labels
// (they are unbounded and may carry customer data).
type DoEvent struct {
	Scope, Key string
	// Outcome is Processed, Duplicate, Released (fn failed), InProgress,
	// Mismatch, LeaseLost, NotRecorded, Panicked, Rejected or Errored; it is
	// empty in the start hook.
	Outcome Outcome
	// Token is the fencing token of the execution that ran (processed,
	// released, lease_lost, panicked) or whose result was replayed.
	Token int64
	// Takeover is set when this execution replaced an expired lease.
	Takeover bool
	// Err is what Do returned (nil for a panic, which goes on).
	Err error
	// Duration is how long Do took.
	Duration time.Duration
	// Heartbeats is how many lease extensions were sent while fn ran, and
	// SlowestHeartbeat the longest one took (including a failed one). A
	// heartbeat that approaches GuardConfig.Lease/3 means the store is too
	// slow for the lease: the lease is at risk of expiring while fn runs.
	Heartbeats       int
	SlowestHeartbeat time.Duration
}

// MinLease is the shortest lease a [Guard] uses: a lease must leave room
// for a few heartbeats, each a store round trip.
const MinLease = 100 * time.Millisecond

// Guard runs a function at most once per (scope, key) over any [Store]: claim
// with a lease, heartbeat while the function runs, store its result on
// success, release the key on failure, and replay the stored result to every
// later call. It is the lease path for effects outside the store's database
// (HTTP handlers, calls to other services); for effects in the same SQL
// database use the stores' transactional Process instead.
//
// A Guard is safe for concurrent use.
type Guard struct {
	store  Store
	cfg    GuardConfig
	starts []DoStartHook
	ends   []DoEndHook
}

// NewGuard returns a Guard over store. cfg may be nil.
func NewGuard(store Store, cfg *GuardConfig) *Guard {
	g := &Guard{store: store}
	if cfg != nil {
		g.cfg = *cfg
	}
	if g.cfg.Lease <= 0 {
		g.cfg.Lease = 30 * time.Second
	}
	g.cfg.Lease = max(g.cfg.Lease, MinLease)
	if g.cfg.Retention <= 0 {
		g.cfg.Retention = DefaultRetention
	}
	if g.cfg.MaxErrorBytes <= 0 {
		g.cfg.MaxErrorBytes = 1024
	}
	if g.cfg.Logger == nil {
		g.cfg.Logger = slog.Default()
	}
	g.starts = HooksOf[DoStartHook](g.cfg.Hooks)
	g.ends = HooksOf[DoEndHook](g.cfg.Hooks)
	return g
}

// Store returns the store the Guard uses.
func (g *Guard) Store() Store { return g.store }

// Config returns the Guard's effective configuration, defaults filled in.
func (g *Guard) Config() GuardConfig { return g.cfg }

// Call names one logical operation.
type Call struct {
	Scope       string
	Key         string
	Fingerprint Fingerprint
	// Retention, when positive, is how long this call's result is kept
	// and replayed, instead of GuardConfig.Retention: a consumer passes
	// the dedupe window its start-up check validated.
	Retention time.Duration
}

// Run is handed to the guarded function: who it runs for and the fencing
// token of its lease.
type Run struct {
	Scope string
	Key   string
	// Token is the fencing token of this execution's lease. Pass it to
	// systems that can reject writes from a stale holder.
	Token int64
	// Takeover is true when an earlier execution's lease expired before it
	// completed: that execution may have done part of the work.
	Takeover bool

	env *runEnv // for StepsOf
}

// DownstreamKey derives the idempotency key to send to an external API for
// one step of this operation (see [DownstreamKey]). It does not depend on
// the token, so a takeover after a crash sends the same key and the external
// system deduplicates the crashed attempt's call.
func (r Run) DownstreamKey(step string) string { return DownstreamKey(r.Scope, r.Key, step) }

// DownstreamKey derives a stable idempotency key for step of the operation
// (scope, key): 64 hex digits of a length-prefixed SHA-256, so it is a valid
// key for any API that accepts printable ASCII and reveals nothing of the
// inputs. Distinct steps of one operation get distinct keys.
func DownstreamKey(scope, key, step string) string {
	return FingerprintParts([]byte("idem-downstream-v1"), []byte(scope), []byte(key), []byte(step)).String()
}

// Result is what [Guard.Do] returns.
type Result struct {
	// Value is the function's result, or the stored result on a replay.
	Value []byte
	// Replayed is true when the function did not run because the operation
	// had already completed.
	Replayed bool
	// Token is the fencing token of the execution that produced Value (on a
	// replay, of the execution that completed).
	Token int64
	// ExpiresAt is, on a replay, when the stored record's retention ends
	// (zero when the store did not say); zero otherwise.
	ExpiresAt time.Time
}

// Do runs fn at most once for call's (scope, key):
//
//   - a new key: fn runs under a lease that is extended while it runs; its
//     result is stored and returned;
//   - fn returns an error: the key is released so a retry runs fn again,
//     unless the error is marked with [Final], in which case it is recorded
//     and replayed as a [*StoredError];
//   - fn panics: the key is released and the panic continues;
//   - the lease is lost while fn runs (it expired and another caller took
//     over, or the record was deleted): fn's context is cancelled with cause
//     ErrLeaseLost and Do returns an error wrapping ErrLeaseLost;
//   - the operation already completed: fn does not run and the stored result
//     is returned with Replayed set (ErrResultDiscarded for a tombstone);
//   - another caller is running it: ErrInProgress, or with GuardConfig.Wait a
//     bounded wait for its result;
//   - the key exists with a different fingerprint: ErrFingerprintMismatch.
//
// The key is validated before the store is touched.
func (g *Guard) Do(ctx context.Context, call Call, fn func(ctx context.Context, run Run) ([]byte, error)) (res Result, err error) {
	ev := DoEvent{Scope: call.Scope, Key: call.Key}
	if len(g.starts) == 0 && len(g.ends) == 0 {
		return g.do(ctx, call, fn, &ev)
	}
	for _, h := range g.starts {
		ctx = h.OnDoStart(ctx, ev)
	}
	ev.Outcome = Panicked
	start := time.Now()
	defer func() {
		ev.Duration = time.Since(start)
		if ev.Outcome != Panicked {
			ev.Err = err
		}
		if ev.Token == 0 {
			ev.Token = res.Token
		}
		for _, h := range g.ends {
			h.OnDoEnd(ctx, ev)
		}
	}()
	return g.do(ctx, call, fn, &ev)
}

// do is Do; it records the outcome in ev.
func (g *Guard) do(ctx context.Context, call Call, fn func(ctx context.Context, run Run) ([]byte, error), ev *DoEvent) (Result, error) {
	if err := Validate(call.Scope, call.Key); err != nil {
		ev.Outcome = Rejected
		return Result{}, err
	}
	var waitUntil time.Time
	if g.cfg.Wait > 0 {
		waitUntil = time.Now().Add(g.cfg.Wait)
	}
	poll := 20 * time.Millisecond
	for {
		claim, err := g.store.Claim(ctx, ClaimRequest{
			Scope: call.Scope, Key: call.Key, Fingerprint: call.Fingerprint, Lease: g.cfg.Lease,
		})
		if err != nil {
			ev.Outcome = Errored
			return Result{}, err
		}
		switch claim.Outcome {
		case Acquired:
			ev.Token, ev.Takeover = claim.Token, claim.Takeover
			return g.run(ctx, call, claim, fn, ev)
		case Completed:
			ev.Outcome = Duplicate
			return replay(claim.Record)
		case Mismatch:
			ev.Outcome = Mismatch
			return Result{}, fmt.Errorf("%w (scope %q, key %q)", ErrFingerprintMismatch, call.Scope, call.Key)
		case InProgress:
			if waitUntil.IsZero() || !time.Now().Before(waitUntil) {
				ev.Outcome = InProgress
				return Result{}, ErrInProgress
			}
			// Poll with jitter so that many waiters do not hit the store in step.
			d := min(time.Duration(rand.Int64N(int64(poll)))+poll/2, time.Until(waitUntil))
			if err := sleep(ctx, d); err != nil {
				ev.Outcome = Errored
				return Result{}, err
			}
			poll = min(2*poll, time.Second)
		default:
			ev.Outcome = Errored
			return Result{}, fmt.Errorf("idem: store returned unknown claim outcome %v", claim.Outcome)
		}
	}
}

// retention is how long call's result (and its steps) are kept.
func (g *Guard) retention(call Call) time.Duration {
	if call.Retention > 0 {
		return call.Retention
	}
	return g.cfg.Retention
}

// replay turns a completed record into Do's return values.
func replay(rec *Record) (Result, error) {
	if rec == nil {
		return Result{}, errors.New("idem: store reported a completed claim without its record")
	}
	res := Result{Replayed: true, Token: rec.Token, ExpiresAt: rec.ExpiresAt}
	switch {
	case rec.Tombstone:
		return res, ErrResultDiscarded
	case rec.Failed:
		return res, &StoredError{Message: string(rec.Result)}
	}
	res.Value = rec.Result
	return res, nil
}

func (g *Guard) run(ctx context.Context, call Call, claim Claim, fn func(context.Context, Run) ([]byte, error), ev *DoEvent) (res Result, err error) {
	run := Run{Scope: call.Scope, Key: call.Key, Token: claim.Token, Takeover: claim.Takeover,
		env: &runEnv{store: g.store, fp: call.Fingerprint, retention: g.retention(call), lease: g.cfg.Lease, logger: g.cfg.Logger}}
	res.Token = claim.Token

	runCtx, cancelRun := context.WithCancelCause(ContextWithRun(ctx, run))
	defer cancelRun(nil)
	hb := g.startHeartbeat(ctx, run, cancelRun)
	defer func() { ev.Heartbeats, ev.SlowestHeartbeat = hb.Stats() }()

	// Cleanup must happen even when the caller's context is already done:
	// otherwise a cancelled request would leave the key locked until the
	// lease expires.
	cleanupCtx := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	}

	panicked := true
	defer func() {
		if !panicked {
			return
		}
		hb.Stop()
		cctx, cancel := cleanupCtx()
		defer cancel()
		if rerr := g.store.Release(cctx, call.Scope, call.Key, run.Token); rerr != nil && !errors.Is(rerr, ErrLeaseLost) {
			g.cfg.Logger.Error("idem: releasing key after panic", "scope", call.Scope, "key", call.Key, "err", rerr)
		}
	}()
	val, fnErr := fn(runCtx, run)
	panicked = false

	if fnErr != nil && !IsFinal(fnErr) {
		if lost := hb.Stop(); lost != nil {
			ev.Outcome = LeaseLost
			return res, fmt.Errorf("%w (scope %q, key %q): %w", ErrLeaseLost, call.Scope, call.Key, fnErr)
		}
		ev.Outcome = Released
		cctx, cancel := cleanupCtx()
		defer cancel()
		if rerr := g.store.Release(cctx, call.Scope, call.Key, run.Token); rerr != nil {
			if errors.Is(rerr, ErrLeaseLost) {
				ev.Outcome = LeaseLost
				return res, fmt.Errorf("%w: %w", fnErr, rerr)
			}
			g.cfg.Logger.Error("idem: releasing key after failure; it stays locked until the lease expires",
				"scope", call.Scope, "key", call.Key, "err", rerr)
		}
		return res, fnErr
	}
	if hb.Lost() != nil {
		hb.Stop()
		ev.Outcome = LeaseLost
		return res, fmt.Errorf("%w (scope %q, key %q) before the result could be stored", ErrLeaseLost, call.Scope, call.Key)
	}

	req := CompleteRequest{Scope: call.Scope, Key: call.Key, Token: run.Token, Result: val, Retention: g.retention(call)}
	if fnErr != nil {
		req.Result, req.Failed = []byte(textcut.Cut(fnErr.Error(), g.cfg.MaxErrorBytes)), true
	}
	// The heartbeat goes on while the result is recorded: if the store
	// fails for a moment, the lease stays ours and Complete is retried, so
	// that a retry of the operation gets ErrInProgress and then the replay,
	// not a second execution.
	cerr := g.complete(ctx, req, hb)
	hb.Stop()
	if cerr != nil {
		ev.Outcome = NotRecorded
		if errors.Is(cerr, ErrLeaseLost) {
			ev.Outcome = LeaseLost
		}
		return res, fmt.Errorf("%w: %w", ErrNotRecorded, cerr)
	}
	ev.Outcome = Processed
	if fnErr != nil {
		return res, fnErr
	}
	res.Value = val
	return res, nil
}

// complete records req. A transient store error ([IsRetryable], or an
// attempt that timed out) is retried with a growing pause while the
// heartbeat holds the lease, for at most one lease; any other error, and
// ErrLeaseLost, ends it at once.
func (g *Guard) complete(ctx context.Context, req CompleteRequest, hb *keeper.Keeper) error {
	attempt := func() error {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(g.cfg.Lease/3, time.Second))
		defer cancel()
		return g.store.Complete(cctx, req)
	}
	giveUp := time.Now().Add(g.cfg.Lease)
	pause := 20 * time.Millisecond
	for {
		// No heartbeat runs while an attempt does: one sent after the
		// record is written would find the lease gone.
		var err error
		final := false
		hb.Exclusive(func() bool {
			err = attempt()
			final = err == nil || errors.Is(err, ErrLeaseLost) ||
				!(IsRetryable(err) || errors.Is(err, context.DeadlineExceeded)) || !time.Now().Before(giveUp)
			return final
		})
		if final {
			return err
		}
		g.cfg.Logger.Warn("idem: recording the result failed; retrying while the lease holds",
			"scope", req.Scope, "key", req.Key, "err", err)
		t := time.NewTimer(min(pause, time.Until(giveUp)))
		select {
		case <-t.C:
		case <-hb.Done():
			// The heartbeat gave up: the store was unreachable for a whole
			// lease, or the lease was lost. One last attempt; fencing
			// refuses it if another caller has taken over meanwhile.
			t.Stop()
			return attempt()
		}
		pause = min(2*pause, time.Second)
	}
}

// startHeartbeat keeps run's lease while fn runs; a lost lease cancels
// fn's context with a cause wrapping ErrLeaseLost.
func (g *Guard) startHeartbeat(ctx context.Context, run Run, cancelRun context.CancelCauseFunc) *keeper.Keeper {
	lease := g.cfg.Lease
	return keeper.Start(ctx, keeper.Config{
		Lease:   lease,
		ErrLost: ErrLeaseLost,
		Extend: func(ctx context.Context) error {
			_, err := g.store.Extend(ctx, run.Scope, run.Key, run.Token, lease)
			if errors.Is(err, ErrLeaseLost) {
				return fmt.Errorf("%w (scope %q, key %q, token %d)", ErrLeaseLost, run.Scope, run.Key, run.Token)
			}
			return err
		},
		OnLost:  cancelRun,
		Logger:  g.cfg.Logger,
		LogArgs: []any{"scope", run.Scope, "key", run.Key},
	})
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}
