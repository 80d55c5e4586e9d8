package idemredis

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/storekit"
	"github.com/redis/rueidis"
)

// DefaultProcessLease is the default of [Config.ProcessLease].
const DefaultProcessLease = 30 * time.Second

// held is a lease ProcessBatch holds on one message's record.
type held struct {
	msg   int // index into the batch
	key   string
	token int64
}

// ProcessBatch runs fn once for the messages of msgs that no earlier batch
// completed: the lease path for a batch, in the shape of the SQL stores'
// ProcessBatch, for effects outside Redis (a Kafka fetch whose records send
// notifications). It claims every message with one [Store.ClaimBatch],
// hands fn the indexes (into msgs, ascending) of the fresh ones, extends
// their leases every [Config.ProcessLease]/3 while fn runs, and completes
// them with one [Store.CompleteBatch], each record kept for its message's
// retention. The results say, per message, Processed, Duplicate or
// Mismatch; a key repeated within msgs is fresh at its first occurrence
// and Duplicate (or Mismatch, with another fingerprint) after. fn is not
// called when nothing is fresh.
//
// When fn returns an error, the batch's leases are released, so a retry
// runs the fresh messages again, and ProcessBatch returns fn's error; when
// fn panics, they are released and the panic goes on. A key
// held by another caller's live lease fails the batch with an error
// wrapping idem.ErrInProgress, before fn runs and with this batch's leases
// released. A lease lost while fn runs (taken over after it expired, or the
// record deleted) cancels fn's context with cause idem.ErrLeaseLost and
// fails the batch. Both errors are marked idem.Retryable, as
// consume.GuardProcess marks them: another worker has the message, so a
// consumer retries later without counting an attempt. This is the lease path: unlike the SQL stores'
// transaction, a failure after fn's effects (a lost lease, Redis gone before
// the completion) means they may run again, so make them idempotent
// downstream where you can (idem.DownstreamKey). At most [MaxBatch]
// messages.
func (s *Store) ProcessBatch(ctx context.Context, msgs []idem.Message, fn func(ctx context.Context, fresh []int) error) ([]idem.Outcome, error) {
	if err := checkBatch(msgs, "process", idem.Message.Validate); err != nil {
		return nil, err
	}
	if fn == nil {
		return nil, fmt.Errorf("%w: idemredis: process batch: nil handler", idem.ErrInvalidConfig)
	}
	if len(msgs) == 0 {
		return nil, nil
	}

	// Claim each distinct (scope, key) once, at its first occurrence.
	first := storekit.Firsts(msgs)
	reqs := make([]idem.ClaimRequest, 0, len(msgs))
	at := make([]int, 0, len(msgs))
	for i, m := range msgs {
		if first[i] != i {
			continue
		}
		reqs = append(reqs, idem.ClaimRequest{Scope: m.Scope, Key: m.Key, Fingerprint: m.Fingerprint, Lease: s.processLease})
		at = append(at, i)
	}
	claims, err := s.claimCalls(ctx, reqs)
	var leases []held
	for k := range claims {
		if c := &claims[k]; c.Err == nil && c.claim.Outcome == idem.Acquired {
			leases = append(leases, held{msg: at[k], key: c.key, token: c.claim.Token})
		}
	}
	if err != nil {
		s.releaseHeld(ctx, leases)
		return nil, fmt.Errorf("idemredis: process batch: %w", err)
	}
	results := make([]idem.Outcome, len(msgs))
	for k := range claims {
		i, c := at[k], &claims[k]
		if c.Err != nil {
			s.releaseHeld(ctx, leases)
			return nil, fmt.Errorf("idemredis: process batch: message %d: %w", i, c.Err)
		}
		res, err := storekit.JudgeClaim(c.claim.Outcome, msgs[i])
		switch {
		case errors.Is(err, idem.ErrInProgress):
			s.releaseHeld(ctx, leases)
			return nil, idem.Retryable(fmt.Errorf("idemredis: process batch: %w", err))
		case res != idem.Mismatch && err != nil:
			s.releaseHeld(ctx, leases)
			return nil, fmt.Errorf("idemredis: process batch: message %d: %w", i, err)
		}
		results[i] = res
	}
	// Redis does not say what a mismatched record holds: its repeats are
	// Mismatch too; other repeats compare with their first occurrence.
	if err := storekit.SettleRepeats(msgs, first, results, nil); err != nil {
		s.releaseHeld(ctx, leases)
		return nil, fmt.Errorf("idemredis: process batch: %w", err)
	}
	fresh := make([]int, 0, len(leases))
	for i := range msgs {
		if first[i] == i && results[i] == idem.Processed {
			fresh = append(fresh, i)
		}
	}
	if len(fresh) == 0 {
		return results, nil
	}

	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	keeper := storekit.Keep(ctx, storekit.KeeperConfig{
		Lease:     s.processLease,
		Extend:    func(ctx context.Context) error { return s.extendHeld(ctx, leases, s.processLease) },
		OnLost:    cancel,
		Logger:    s.logger,
		LogPrefix: "idemredis: process batch",
	})
	panicked := true
	defer func() {
		if panicked { // stop extending, give the leases back, let the panic go on
			keeper.Stop()
			s.releaseHeld(ctx, leases)
		}
	}()
	err = fn(runCtx, fresh)
	panicked = false
	lost := keeper.Stop()
	switch {
	case lost != nil:
		if err != nil {
			return nil, idem.Retryable(fmt.Errorf("idemredis: process batch: %w (handler: %w)", lost, err))
		}
		return nil, idem.Retryable(fmt.Errorf("idemredis: process batch: %w before the results could be stored", lost))
	case err != nil:
		s.releaseHeld(ctx, leases)
		return nil, fmt.Errorf("idemredis: process batch: handler: %w", err)
	}

	done := make([]call, len(leases))
	for k, l := range leases {
		m := msgs[l.msg]
		done[k].Err = s.completeCall(&done[k], l.key, idem.CompleteRequest{Token: l.token, Retention: m.RetentionOrDefault()})
	}
	cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer ccancel()
	if err = s.completeCalls(cctx, done); err == nil {
		errs := make([]error, 0, len(done))
		for k := range done {
			errs = append(errs, done[k].Err)
		}
		err = errors.Join(errs...)
	}
	if err != nil {
		return nil, fmt.Errorf("idemredis: process batch: the handler ran but its results could not all be recorded: %w", err)
	}
	return results, nil
}

// extendHeld pushes every lease to now + lease in one round trip. It
// returns an error wrapping ErrLeaseLost when a lease is no longer held.
func (s *Store) extendHeld(ctx context.Context, leases []held, lease time.Duration) error {
	ms := millis(lease)
	execs := make([]rueidis.LuaExec, len(leases))
	for i, l := range leases {
		execs[i] = rueidis.LuaExec{Keys: []string{l.key}, Args: []string{tokenText(l.token), ms, s.abandonMS}}
	}
	var errs []error
	for i, r := range extendLua.ExecMulti(ctx, s.client, execs...) {
		le, err := r.AsInt64()
		if err := s.tokenReply("extend", leases[i].key, leases[i].token, le, err); err != nil {
			if errors.Is(err, idem.ErrLeaseLost) {
				return err
			}
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// releaseHeld gives leases back in one round trip, even when ctx has
// ended; a lease it cannot release expires on its own.
func (s *Store) releaseHeld(ctx context.Context, leases []held) {
	if len(leases) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	execs := make([]rueidis.LuaExec, len(leases))
	for i, l := range leases {
		execs[i] = rueidis.LuaExec{Keys: []string{l.key}, Args: []string{tokenText(l.token), s.floorMS}}
	}
	for i, r := range releaseLua.ExecMulti(ctx, s.client, execs...) {
		n, err := r.AsInt64()
		if err := s.tokenReply("release", leases[i].key, leases[i].token, n, err); err != nil && !errors.Is(err, idem.ErrLeaseLost) {
			s.logger.WarnContext(ctx, "idemredis: process batch: release failed; the lease expires on its own", "err", err)
		}
	}
}
