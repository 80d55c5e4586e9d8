package idem_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest"
)

func call(key string) idem.Call {
	return idem.Call{Scope: "test", Key: key, Fingerprint: idem.FingerprintBytes([]byte("payload"))}
}

func TestGuardRunsOnceAndReplays(t *testing.T) {
	t.Parallel()
	g := idem.NewGuard(idemtest.NewMemoryStore(nil), nil)
	var runs atomic.Int32
	fn := func(ctx context.Context, run idem.Run) ([]byte, error) {
		runs.Add(1)
		return []byte(fmt.Sprintf("charged with token %d", run.Token)), nil
	}
	first, err := g.Do(context.Background(), call("k1"), fn)
	if err != nil || first.Replayed || first.Token == 0 {
		t.Fatalf("first Do = %+v, %v", first, err)
	}
	for range 3 {
		again, err := g.Do(context.Background(), call("k1"), fn)
		if err != nil || !again.Replayed || string(again.Value) != string(first.Value) || again.Token != first.Token {
			t.Fatalf("replay = %+v, %v; want %q replayed", again, err, first.Value)
		}
	}
	if runs.Load() != 1 {
		t.Fatalf("fn ran %d times, want 1", runs.Load())
	}
}

func TestGuardReleasesOnErrorSoRetryRuns(t *testing.T) {
	t.Parallel()
	g := idem.NewGuard(idemtest.NewMemoryStore(nil), nil)
	boom := errors.New("gateway timeout")
	_, err := g.Do(context.Background(), call("k"), func(context.Context, idem.Run) ([]byte, error) { return nil, boom })
	if !errors.Is(err, boom) {
		t.Fatalf("Do = %v, want the handler's error", err)
	}
	res, err := g.Do(context.Background(), call("k"), func(context.Context, idem.Run) ([]byte, error) { return []byte("ok"), nil })
	if err != nil || res.Replayed || string(res.Value) != "ok" {
		t.Fatalf("retry after a failure = %+v, %v; want a fresh run", res, err)
	}
}

func TestGuardFinalErrorIsRecordedAndReplayed(t *testing.T) {
	t.Parallel()
	g := idem.NewGuard(idemtest.NewMemoryStore(nil), &idem.GuardConfig{MaxErrorBytes: 16})
	declined := idem.Final(errors.New("card declined: insufficient funds"))
	var runs atomic.Int32
	fn := func(context.Context, idem.Run) ([]byte, error) { runs.Add(1); return nil, declined }
	if _, err := g.Do(context.Background(), call("k"), fn); !errors.Is(err, declined) {
		t.Fatalf("first Do = %v", err)
	}
	res, err := g.Do(context.Background(), call("k"), fn)
	var stored *idem.StoredError
	if !errors.As(err, &stored) || !res.Replayed {
		t.Fatalf("replay = %+v, %v; want a StoredError", res, err)
	}
	if stored.Message != "card declined: i" {
		t.Errorf("stored message = %q, want the first 16 bytes", stored.Message)
	}
	if runs.Load() != 1 {
		t.Errorf("fn ran %d times", runs.Load())
	}

	// The cut never splits a UTF-8 sequence: 4 bytes of "aéé" end inside the second é.
	g4 := idem.NewGuard(idemtest.NewMemoryStore(nil), &idem.GuardConfig{MaxErrorBytes: 4})
	_, _ = g4.Do(context.Background(), call("k"), func(context.Context, idem.Run) ([]byte, error) {
		return nil, idem.Final(errors.New("aéé"))
	})
	if _, err = g4.Do(context.Background(), call("k"), fn); !errors.As(err, &stored) || stored.Message != "aé" {
		t.Errorf("stored message = %q, want \"aé\" (4 bytes would split the second é)", stored.Message)
	}
}

func TestGuardPanicReleasesAndPropagates(t *testing.T) {
	t.Parallel()
	store := idemtest.NewMemoryStore(nil)
	g := idem.NewGuard(store, nil)
	func() {
		defer func() {
			if r := recover(); r != "handler bug" {
				t.Fatalf("recovered %v, want the handler's panic", r)
			}
		}()
		_, _ = g.Do(context.Background(), call("k"), func(context.Context, idem.Run) ([]byte, error) { panic("handler bug") })
	}()
	if _, err := store.Get(context.Background(), "test", "k"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("after a panic the key should be released, Get = %v", err)
	}
}

func TestGuardConcurrentCallersRunOnce(t *testing.T) {
	t.Parallel()
	for _, wait := range []time.Duration{0, 5 * time.Second} {
		t.Run(fmt.Sprintf("wait=%v", wait), func(t *testing.T) {
			t.Parallel()
			g := idem.NewGuard(idemtest.NewMemoryStore(nil), &idem.GuardConfig{Wait: wait})
			var runs atomic.Int32
			var inProgress, replayed, fresh atomic.Int32
			var wg sync.WaitGroup
			for range 64 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					res, err := g.Do(context.Background(), call("hot"), func(context.Context, idem.Run) ([]byte, error) {
						runs.Add(1)
						time.Sleep(100 * time.Millisecond)
						return []byte("result"), nil
					})
					switch {
					case errors.Is(err, idem.ErrInProgress):
						inProgress.Add(1)
					case err != nil:
						t.Errorf("Do: %v", err)
					case string(res.Value) != "result":
						t.Errorf("value %q", res.Value)
					case res.Replayed:
						replayed.Add(1)
					default:
						fresh.Add(1)
					}
				}()
			}
			wg.Wait()
			if runs.Load() != 1 || fresh.Load() != 1 {
				t.Fatalf("fn ran %d times (%d fresh results), want exactly 1", runs.Load(), fresh.Load())
			}
			if wait > 0 && inProgress.Load() != 0 {
				t.Fatalf("with Wait, %d callers still got ErrInProgress", inProgress.Load())
			}
			if inProgress.Load()+replayed.Load() != 63 {
				t.Fatalf("in progress %d + replayed %d, want 63", inProgress.Load(), replayed.Load())
			}
		})
	}
}

func TestGuardWaitGivesUpAfterBound(t *testing.T) {
	t.Parallel()
	store := idemtest.NewMemoryStore(nil)
	if _, err := store.Claim(context.Background(), idem.ClaimRequest{Scope: "test", Key: "stuck", Fingerprint: call("").Fingerprint, Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	g := idem.NewGuard(store, &idem.GuardConfig{Wait: 150 * time.Millisecond})
	start := time.Now()
	_, err := g.Do(context.Background(), call("stuck"), func(context.Context, idem.Run) ([]byte, error) {
		t.Error("fn must not run while another caller holds the lease")
		return nil, nil
	})
	if !errors.Is(err, idem.ErrInProgress) {
		t.Fatalf("Do = %v, want ErrInProgress", err)
	}
	if d := time.Since(start); d < 150*time.Millisecond || d > 2*time.Second {
		t.Fatalf("waited %v, want about 150ms", d)
	}
}

func TestGuardHeartbeatKeepsLease(t *testing.T) {
	t.Parallel()
	store := idemtest.NewMemoryStore(nil)
	g := idem.NewGuard(store, &idem.GuardConfig{Lease: 150 * time.Millisecond})
	_, err := g.Do(context.Background(), call("long"), func(ctx context.Context, run idem.Run) ([]byte, error) {
		// Run for several leases; the heartbeat must keep others out.
		for range 6 {
			time.Sleep(100 * time.Millisecond)
			c, err := store.Claim(ctx, idem.ClaimRequest{Scope: "test", Key: "long", Fingerprint: call("").Fingerprint, Lease: time.Second})
			if err != nil || c.Outcome != idem.InProgress {
				return nil, fmt.Errorf("a concurrent claim got %v, %v while the holder was alive", c.Outcome, err)
			}
		}
		return []byte("done"), ctx.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestGuardLeaseLostCancelsFn(t *testing.T) {
	t.Parallel()
	store := idemtest.NewMemoryStore(nil)
	g := idem.NewGuard(store, &idem.GuardConfig{Lease: 90 * time.Millisecond})
	_, err := g.Do(context.Background(), call("lost"), func(ctx context.Context, run idem.Run) ([]byte, error) {
		// An operator deletes the record: the next heartbeat finds the token stale.
		if err := store.Delete(ctx, "test", "lost"); err != nil {
			return nil, err
		}
		select {
		case <-ctx.Done():
			if !errors.Is(context.Cause(ctx), idem.ErrLeaseLost) {
				return nil, fmt.Errorf("cancel cause %v, want ErrLeaseLost", context.Cause(ctx))
			}
			return nil, ctx.Err()
		case <-time.After(5 * time.Second):
			return nil, errors.New("fn was not cancelled after the lease was lost")
		}
	})
	if !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Do = %v, want ErrLeaseLost", err)
	}
	if _, err := store.Get(context.Background(), "test", "lost"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("a lost lease must not complete the record, Get = %v", err)
	}
}

func TestGuardTakeoverAfterLeaseExpiry(t *testing.T) {
	t.Parallel()
	clock := idemtest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	store := idemtest.NewMemoryStore(&idemtest.MemoryOptions{Now: clock.Now})
	crashed, err := store.Claim(context.Background(), idem.ClaimRequest{Scope: "test", Key: "k", Fingerprint: call("").Fingerprint, Lease: 30 * time.Second})
	if err != nil || crashed.Outcome != idem.Acquired {
		t.Fatalf("claim = %+v, %v", crashed, err)
	}
	g := idem.NewGuard(store, nil)
	if _, err := g.Do(context.Background(), call("k"), func(context.Context, idem.Run) ([]byte, error) { return nil, nil }); !errors.Is(err, idem.ErrInProgress) {
		t.Fatalf("before expiry Do = %v, want ErrInProgress", err)
	}
	clock.Advance(31 * time.Second)
	res, err := g.Do(context.Background(), call("k"), func(_ context.Context, run idem.Run) ([]byte, error) {
		if !run.Takeover || run.Token <= crashed.Token {
			return nil, fmt.Errorf("run = %+v, want a takeover with a token above %d", run, crashed.Token)
		}
		return []byte("recovered"), nil
	})
	if err != nil || string(res.Value) != "recovered" {
		t.Fatalf("takeover Do = %+v, %v", res, err)
	}
	err = store.Complete(context.Background(), idem.CompleteRequest{Scope: "test", Key: "k", Token: crashed.Token, Result: []byte("late"), Retention: time.Hour})
	if !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("the crashed holder's Complete = %v, want ErrLeaseLost", err)
	}
}

func TestGuardMismatchAndTombstone(t *testing.T) {
	t.Parallel()
	store := idemtest.NewMemoryStore(&idemtest.MemoryOptions{MaxResultBytes: 8})
	g := idem.NewGuard(store, nil)
	big := func(context.Context, idem.Run) ([]byte, error) { return []byte(strings.Repeat("x", 9)), nil }
	res, err := g.Do(context.Background(), call("k"), big)
	if err != nil || len(res.Value) != 9 {
		t.Fatalf("the first caller must get the whole result: %+v, %v", res, err)
	}
	if _, err := g.Do(context.Background(), call("k"), big); !errors.Is(err, idem.ErrResultDiscarded) {
		t.Fatalf("replay of a tombstone = %v, want ErrResultDiscarded", err)
	}
	other := idem.Call{Scope: "test", Key: "k", Fingerprint: idem.FingerprintBytes([]byte("other payload"))}
	if _, err := g.Do(context.Background(), other, big); !errors.Is(err, idem.ErrFingerprintMismatch) {
		t.Fatalf("different payload = %v, want ErrFingerprintMismatch", err)
	}
}

// countingStore counts calls so that tests can prove the store was never touched.
type countingStore struct {
	idem.Store
	calls atomic.Int32
}

func (c *countingStore) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	c.calls.Add(1)
	return c.Store.Claim(ctx, req)
}

func TestGuardRejectsInvalidKeyBeforeStore(t *testing.T) {
	t.Parallel()
	store := &countingStore{Store: idemtest.NewMemoryStore(nil)}
	g := idem.NewGuard(store, nil)
	for _, key := range []string{"", strings.Repeat("k", 256), "naïve", "a\nb"} {
		_, err := g.Do(context.Background(), idem.Call{Key: key}, func(context.Context, idem.Run) ([]byte, error) {
			t.Error("fn ran for an invalid key")
			return nil, nil
		})
		if !errors.Is(err, idem.ErrInvalidKey) {
			t.Errorf("Do(%q) = %v, want ErrInvalidKey", key, err)
		}
	}
	if store.calls.Load() != 0 {
		t.Fatalf("the store was called %d times for invalid keys", store.calls.Load())
	}
}

// failingStore fails Claim with a transient error.
type failingStore struct{ idem.Store }

func (failingStore) Claim(context.Context, idem.ClaimRequest) (idem.Claim, error) {
	return idem.Claim{}, idem.Retryable(errors.New("connection refused"))
}

func TestGuardStoreErrorRunsNothing(t *testing.T) {
	t.Parallel()
	g := idem.NewGuard(failingStore{idemtest.NewMemoryStore(nil)}, nil)
	_, err := g.Do(context.Background(), call("k"), func(context.Context, idem.Run) ([]byte, error) {
		t.Error("fn ran although the claim failed")
		return nil, nil
	})
	if !idem.IsRetryable(err) {
		t.Fatalf("Do = %v, want the store's retryable error", err)
	}
}

func TestDownstreamKey(t *testing.T) {
	t.Parallel()
	a := idem.DownstreamKey("user:1", "order-9", "charge")
	if a != idem.DownstreamKey("user:1", "order-9", "charge") {
		t.Fatal("downstream key is not stable")
	}
	if err := idem.ValidateKey(a); err != nil {
		t.Fatalf("downstream key is not a valid key: %v", err)
	}
	for _, other := range []string{
		idem.DownstreamKey("user:1", "order-9", "refund"),
		idem.DownstreamKey("user:2", "order-9", "charge"),
		idem.DownstreamKey("user:1o", "rder-9", "charge"),
	} {
		if other == a {
			t.Fatal("distinct (scope, key, step) gave the same downstream key")
		}
	}
	run := idem.Run{Scope: "user:1", Key: "order-9", Token: 7}
	if run.DownstreamKey("charge") != a {
		t.Fatal("Run.DownstreamKey must not depend on the token")
	}
}

// events records the events of the Guards it hooks.
type events struct {
	mu     sync.Mutex
	evs    []idem.DoEvent
	starts int
}

type startKey struct{}

func (e *events) OnDoStart(ctx context.Context, ev idem.DoEvent) context.Context {
	e.mu.Lock()
	e.starts++
	e.mu.Unlock()
	return context.WithValue(ctx, startKey{}, ev.Key)
}

func (e *events) OnDoEnd(ctx context.Context, ev idem.DoEvent) {
	if ctx.Value(startKey{}) != ev.Key {
		panic("the end hook did not get the start hook's context")
	}
	e.mu.Lock()
	e.evs = append(e.evs, ev)
	e.mu.Unlock()
}

// last returns the only event recorded since the previous call.
func (e *events) last(t *testing.T) idem.DoEvent {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.evs) != 1 {
		t.Fatalf("%d events, want exactly one per Do: %+v", len(e.evs), e.evs)
	}
	ev := e.evs[0]
	e.evs = nil
	return ev
}

// completeFailsStore fails every Complete.
type completeFailsStore struct{ idem.Store }

func (completeFailsStore) Complete(context.Context, idem.CompleteRequest) error {
	return idem.Retryable(errors.New("connection reset"))
}

func TestGuardHooksReportEveryOutcome(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var rec events
	clock := idemtest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	store := idemtest.NewMemoryStore(&idemtest.MemoryOptions{Now: clock.Now, MaxResultBytes: 8})
	cfg := &idem.GuardConfig{Hooks: []idem.Hook{&rec}}
	g := idem.NewGuard(store, cfg)
	ok := func(context.Context, idem.Run) ([]byte, error) { return []byte("done"), nil }
	boom := errors.New("boom")

	want := func(what string, ev idem.DoEvent, outcome idem.Outcome, errIs error, tokenSet bool) {
		t.Helper()
		if ev.Outcome != outcome || ev.Scope != "test" {
			t.Errorf("%s: event %+v, want outcome %s in scope test", what, ev, outcome)
		}
		if (errIs == nil) != (ev.Err == nil) || (errIs != nil && !errors.Is(ev.Err, errIs)) {
			t.Errorf("%s: event error %v, want %v", what, ev.Err, errIs)
		}
		if tokenSet != (ev.Token > 0) {
			t.Errorf("%s: event token %d, want set=%v", what, ev.Token, tokenSet)
		}
		if ev.Duration <= 0 {
			t.Errorf("%s: duration %v", what, ev.Duration)
		}
	}

	res, _ := g.Do(ctx, call("a"), ok)
	ev := rec.last(t)
	want("first call", ev, idem.Processed, nil, true)
	if ev.Token != res.Token || ev.Key != "a" {
		t.Errorf("executed event %+v, want token %d and key a", ev, res.Token)
	}
	_, _ = g.Do(ctx, call("a"), ok)
	want("second call", rec.last(t), idem.Duplicate, nil, true)

	_, _ = g.Do(ctx, call("b"), func(context.Context, idem.Run) ([]byte, error) { return nil, boom })
	want("fn error", rec.last(t), idem.Released, boom, true)
	_, _ = g.Do(ctx, call("c"), func(context.Context, idem.Run) ([]byte, error) { return nil, idem.Final(boom) })
	want("final error", rec.last(t), idem.Processed, boom, true)
	_, _ = g.Do(ctx, call("c"), ok)
	var stored *idem.StoredError
	if ev := rec.last(t); ev.Outcome != idem.Duplicate || !errors.As(ev.Err, &stored) || ev.Token == 0 {
		t.Errorf("replayed final error: event %+v, want replayed with a *StoredError", ev)
	}
	_, _ = g.Do(ctx, call("t"), func(context.Context, idem.Run) ([]byte, error) { return []byte("too large to keep"), nil })
	rec.last(t)
	_, _ = g.Do(ctx, call("t"), ok)
	want("tombstone", rec.last(t), idem.Duplicate, idem.ErrResultDiscarded, true)

	other := idem.Call{Scope: "test", Key: "a", Fingerprint: idem.FingerprintBytes([]byte("other"))}
	_, _ = g.Do(ctx, other, ok)
	want("other payload", rec.last(t), idem.Mismatch, idem.ErrFingerprintMismatch, false)

	_, _ = g.Do(ctx, idem.Call{Scope: "test", Key: "a\nb"}, ok)
	want("invalid key", rec.last(t), idem.Rejected, idem.ErrInvalidKey, false)

	held, err := store.Claim(ctx, idem.ClaimRequest{Scope: "test", Key: "held", Fingerprint: call("").Fingerprint, Lease: time.Minute})
	if err != nil || held.Outcome != idem.Acquired {
		t.Fatal(held, err)
	}
	_, _ = g.Do(ctx, call("held"), ok)
	want("held key", rec.last(t), idem.InProgress, idem.ErrInProgress, false)
	clock.Advance(2 * time.Minute)
	_, _ = g.Do(ctx, call("held"), ok)
	ev = rec.last(t)
	want("takeover", ev, idem.Processed, nil, true)
	if !ev.Takeover || ev.Token <= held.Token {
		t.Errorf("takeover event %+v, want Takeover and a token above %d", ev, held.Token)
	}

	_, _ = g.Do(ctx, call("lost"), func(ctx context.Context, run idem.Run) ([]byte, error) {
		return nil, store.Delete(ctx, "test", "lost") // the operator deleted it: Complete finds no lease
	})
	want("record deleted while fn ran", rec.last(t), idem.LeaseLost, idem.ErrLeaseLost, true)

	func() {
		defer func() {
			if recover() == nil {
				t.Error("the panic did not go on")
			}
		}()
		_, _ = g.Do(ctx, call("p"), func(context.Context, idem.Run) ([]byte, error) { panic("handler bug") })
	}()
	want("panic", rec.last(t), idem.Panicked, nil, true)

	gf := idem.NewGuard(failingStore{store}, cfg)
	_, _ = gf.Do(ctx, call("s"), ok)
	if ev := rec.last(t); ev.Outcome != idem.Errored || !idem.IsRetryable(ev.Err) || ev.Token != 0 {
		t.Errorf("claim fails: event %+v, want error with the store's retryable error and no token", ev)
	}
	// A Complete that keeps failing is retried for one lease, then given up.
	gc := idem.NewGuard(completeFailsStore{store}, &idem.GuardConfig{Hooks: []idem.Hook{&rec}, Lease: 300 * time.Millisecond})
	_, _ = gc.Do(ctx, call("r"), ok)
	ev = rec.last(t)
	if ev.Outcome != idem.NotRecorded || !idem.IsRetryable(ev.Err) || !errors.Is(ev.Err, idem.ErrNotRecorded) || ev.Token == 0 {
		t.Errorf("complete fails: event %+v, want not_recorded with the store's retryable error and the run's token", ev)
	}

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	gw := idem.NewGuard(store, &idem.GuardConfig{Hooks: []idem.Hook{&rec}, Wait: time.Minute})
	if _, err := store.Claim(ctx, idem.ClaimRequest{Scope: "test", Key: "w", Fingerprint: call("").Fingerprint, Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	_, _ = gw.Do(cctx, call("w"), ok)
	want("wait cancelled", rec.last(t), idem.Errored, context.Canceled, false)
}

// flakyCompleteStore fails the first n Completes with a transient error and
// checks, at each failure, that the key is still held against other callers.
type flakyCompleteStore struct {
	idem.Store
	n        atomic.Int32
	heldSeen atomic.Int32
	err      error
}

func (s *flakyCompleteStore) Complete(ctx context.Context, req idem.CompleteRequest) error {
	if s.n.Add(-1) >= 0 {
		c, err := s.Store.Claim(ctx, idem.ClaimRequest{Scope: req.Scope, Key: req.Key, Fingerprint: call("").Fingerprint, Lease: time.Second})
		if err == nil && c.Outcome == idem.InProgress {
			s.heldSeen.Add(1)
		}
		return s.err
	}
	return s.Store.Complete(ctx, req)
}

// A store that fails for a moment while the result is recorded: the Guard
// retries the record while it holds the lease, so the operation is recorded
// once and a retry meanwhile finds it in progress, never free to run again.
func TestGuardRetriesRecordWhileLeaseHolds(t *testing.T) {
	t.Parallel()
	store := &flakyCompleteStore{Store: idemtest.NewMemoryStore(nil), err: idem.Retryable(errors.New("connection reset"))}
	store.n.Store(3)
	var rec events
	g := idem.NewGuard(store, &idem.GuardConfig{Hooks: []idem.Hook{&rec}})
	var runs atomic.Int32
	fn := func(context.Context, idem.Run) ([]byte, error) { runs.Add(1); return []byte("charged"), nil }
	res, err := g.Do(context.Background(), call("flaky"), fn)
	if err != nil || string(res.Value) != "charged" || res.Replayed {
		t.Fatalf("Do = %+v, %v; want the result, recorded after the store came back", res, err)
	}
	if ev := rec.last(t); ev.Outcome != idem.Processed {
		t.Fatalf("event %+v, want executed", ev)
	}
	if got := store.heldSeen.Load(); got != 3 {
		t.Fatalf("the key was held during %d of 3 failed records", got)
	}
	again, err := g.Do(context.Background(), call("flaky"), fn)
	if err != nil || !again.Replayed || string(again.Value) != "charged" || runs.Load() != 1 {
		t.Fatalf("retry = %+v, %v after %d runs; want the replay of the one run", again, err, runs.Load())
	}
}

// A store error that is not transient is not retried: Do reports at once
// that the effect happened but was not recorded, and the key stays claimed
// (a retry gets ErrInProgress until the lease expires), not released.
func TestGuardUnrecordedResultKeepsKeyClaimed(t *testing.T) {
	t.Parallel()
	mem := idemtest.NewMemoryStore(nil)
	store := &flakyCompleteStore{Store: mem, err: errors.New("disk full")}
	store.n.Store(100)
	g := idem.NewGuard(store, nil)
	var runs atomic.Int32
	fn := func(context.Context, idem.Run) ([]byte, error) { runs.Add(1); return []byte("charged"), nil }
	_, err := g.Do(context.Background(), call("unrecorded"), fn)
	if !errors.Is(err, idem.ErrNotRecorded) || errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Do = %v, want ErrNotRecorded", err)
	}
	if left := store.n.Load(); left != 99 {
		t.Fatalf("Complete tried %d times, want once for a permanent error", 100-left)
	}
	if _, err := g.Do(context.Background(), call("unrecorded"), fn); !errors.Is(err, idem.ErrInProgress) || runs.Load() != 1 {
		t.Fatalf("retry = %v after %d runs; want ErrInProgress and no second run", err, runs.Load())
	}
	rec, err := mem.Get(context.Background(), "test", "unrecorded")
	if err != nil || rec.State != idem.StateInProgress {
		t.Fatalf("record %+v, %v; want it still in progress", rec, err)
	}
}

// slowExtendStore delays every Extend and signals that one happened.
type slowExtendStore struct {
	idem.Store
	delay    time.Duration
	extended chan struct{}
}

func (s *slowExtendStore) Extend(ctx context.Context, scope, key string, token int64, lease time.Duration) (time.Time, error) {
	time.Sleep(s.delay)
	select {
	case s.extended <- struct{}{}:
	default:
	}
	// Past the Guard's per-heartbeat timeout: finish regardless, as a slow
	// server would.
	return s.Store.Extend(context.WithoutCancel(ctx), scope, key, token, lease)
}

// DoEvent reports how many heartbeats ran and the slowest one, so metrics
// can show a store whose latency approaches the lease.
func TestGuardReportsHeartbeatLatency(t *testing.T) {
	t.Parallel()
	store := &slowExtendStore{Store: idemtest.NewMemoryStore(nil), delay: 120 * time.Millisecond, extended: make(chan struct{})}
	var rec events
	g := idem.NewGuard(store, &idem.GuardConfig{Hooks: []idem.Hook{&rec}, Lease: 300 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)})
	_, err := g.Do(context.Background(), call("hb"), func(ctx context.Context, _ idem.Run) ([]byte, error) {
		select {
		case <-store.extended:
			return []byte("ok"), nil
		case <-time.After(time.Minute):
			return nil, errors.New("no heartbeat within a minute")
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	ev := rec.last(t)
	if ev.Heartbeats < 1 || ev.SlowestHeartbeat < store.delay {
		t.Fatalf("event %+v: want at least one heartbeat of at least %v", ev, store.delay)
	}
}
