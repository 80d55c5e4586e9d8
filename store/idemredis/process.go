package idemredis

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem"
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
// Mismatched; a key repeated within msgs is fresh at its first occurrence
// and Duplicate (or Mismatched, with another fingerprint) after. fn is not
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
// downstream where you can (idem.DownstreamKey). At most [MaxClaimBatch]
// messages.
func (s *Store) ProcessBatch(ctx context.Context, msgs []idem.Message, fn func(ctx context.Context, fresh []int) error) ([]idem.ProcessResult, error) {
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
	type ref struct{ scope, key string }
	first := make(map[ref]int, len(msgs))
	reqs := make([]idem.ClaimRequest, 0, len(msgs))
	at := make([]int, 0, len(msgs))
	for i, m := range msgs {
		if _, seen := first[ref{m.Scope, m.Key}]; seen {
			continue
		}
		first[ref{m.Scope, m.Key}] = i
		reqs = append(reqs, idem.ClaimRequest{Scope: m.Scope, Key: m.Key, Fingerprint: m.Fingerprint, Lease: s.processLease})
		at = append(at, i)
	}
	claims, err := s.claimCalls(ctx, reqs)
	var leases []held
	for k := range claims {
		if c := &claims[k]; c.err == nil && c.claim.Outcome == idem.Acquired {
			leases = append(leases, held{msg: at[k], key: c.key, token: c.claim.Token})
		}
	}
	if err != nil {
		s.releaseHeld(ctx, leases)
		return nil, fmt.Errorf("idemredis: process batch: %w", err)
	}
	results := make([]idem.ProcessResult, len(msgs))
	for k := range claims {
		i, m, c := at[k], msgs[at[k]], &claims[k]
		switch {
		case c.err != nil:
			s.releaseHeld(ctx, leases)
			return nil, fmt.Errorf("idemredis: process batch: message %d: %w", i, c.err)
		case c.claim.Outcome == idem.Acquired:
			results[i] = idem.Processed
		case c.claim.Outcome == idem.Completed:
			results[i] = idem.Duplicate
		case c.claim.Outcome == idem.Mismatch:
			results[i] = idem.Mismatched
		case c.claim.Outcome == idem.InProgress:
			s.releaseHeld(ctx, leases)
			return nil, idem.Retryable(fmt.Errorf("idemredis: process batch %q in scope %q: %w", m.Key, m.Scope, idem.ErrInProgress))
		default:
			s.releaseHeld(ctx, leases)
			return nil, fmt.Errorf("idemredis: process batch: message %d: unknown claim outcome %v", i, c.claim.Outcome)
		}
	}
	fresh := make([]int, 0, len(leases))
	for i, m := range msgs {
		j := first[ref{m.Scope, m.Key}]
		switch {
		case j == i:
			if results[i] == idem.Processed {
				fresh = append(fresh, i)
			}
		case m.Fingerprint != msgs[j].Fingerprint || results[j] == idem.Mismatched:
			results[i] = idem.Mismatched
		default:
			results[i] = idem.Duplicate
		}
	}
	if len(fresh) == 0 {
		return results, nil
	}

	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := s.heartbeat(ctx, leases, cancel)
	panicked := true
	defer func() {
		if panicked { // stop extending, give the leases back, let the panic go on
			stop()
			s.releaseHeld(ctx, leases)
		}
	}()
	err = fn(runCtx, fresh)
	panicked = false
	lost := stop()
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
		done[k].err = s.completeCall(&done[k], l.key, idem.CompleteRequest{Token: l.token, Retention: m.RetentionOrDefault()})
	}
	cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer ccancel()
	if err = s.completeCalls(cctx, done); err == nil {
		errs := make([]error, 0, len(done))
		for k := range done {
			errs = append(errs, done[k].err)
		}
		err = errors.Join(errs...)
	}
	if err != nil {
		return nil, fmt.Errorf("idemredis: process batch: the handler ran but its results could not all be recorded: %w", err)
	}
	return results, nil
}

// heartbeat extends leases every ProcessLease/3, all in one round trip,
// until the returned stop is called. A lease found lost, or a store
// unreachable for a whole lease, cancels the run with cause ErrLeaseLost;
// stop returns that cause, or nil.
func (s *Store) heartbeat(ctx context.Context, leases []held, cancel context.CancelCauseFunc) (stop func() error) {
	quit, done := make(chan struct{}), make(chan struct{})
	var lost error
	lease := s.processLease
	go func() {
		defer close(done)
		t := time.NewTicker(lease / 3)
		defer t.Stop()
		deadline := time.Now().Add(lease)
		for {
			select {
			case <-quit:
				return
			case <-t.C:
			}
			sent := time.Now()
			err := s.extendHeld(context.WithoutCancel(ctx), leases, lease)
			switch {
			case err == nil:
				deadline = sent.Add(lease)
				continue
			case errors.Is(err, idem.ErrLeaseLost):
				lost = err
			case time.Now().After(deadline):
				lost = fmt.Errorf("%w: store unreachable for a whole lease: %w", idem.ErrLeaseLost, err)
			default:
				s.logger.WarnContext(ctx, "idemredis: process batch heartbeat failed", "err", err)
				continue
			}
			cancel(lost)
			return
		}
	}()
	return func() error {
		close(quit)
		<-done
		return lost
	}
}

// extendHeld pushes every lease to now + lease in one round trip. It
// returns an error wrapping ErrLeaseLost when a lease is no longer held.
func (s *Store) extendHeld(ctx context.Context, leases []held, lease time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, lease/3)
	defer cancel()
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
