package idem_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest"
)

// rideSteps is the classic operation: create a ride, charge the card, send
// the receipt. counts counts the executions of each step; failAt names a
// step that fails (once) after it ran.
type rideSteps struct {
	mu     sync.Mutex
	counts map[string]int
	keys   map[string]string // step -> DownstreamKey it was called with
	failAt string
}

func newRide() *rideSteps {
	return &rideSteps{counts: map[string]int{}, keys: map[string]string{}}
}

func (r *rideSteps) fn(ctx context.Context, run idem.Run) ([]byte, error) {
	s := idem.StepsOf(run)
	var out []string
	for _, name := range []string{"create-ride", "charge", "receipt"} {
		v, err := s.Do(ctx, name, func(ctx context.Context, st idem.Step) ([]byte, error) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.counts[name]++
			r.keys[name] = st.DownstreamKey
			if r.failAt == name {
				r.failAt = ""
				return nil, fmt.Errorf("%s: gateway timeout", name)
			}
			return []byte(name + "-ok"), nil
		})
		if err != nil {
			return nil, err
		}
		out = append(out, string(v))
	}
	return []byte(strings.Join(out, " ")), nil
}

func TestStepsResumeAfterFailure(t *testing.T) {
	t.Parallel()
	store := idemtest.NewMemoryStore(nil)
	g := idem.NewGuard(store, nil)
	ride := newRide()
	ride.failAt = "receipt"
	ctx := context.Background()
	if _, err := g.Do(ctx, call("ride-1"), ride.fn); err == nil || !strings.Contains(err.Error(), "gateway timeout") {
		t.Fatalf("first attempt: want the receipt's error, got %v", err)
	}
	// The key was released, the two recorded steps were kept.
	recs, err := store.Steps(ctx, "test", "ride-1")
	if err != nil || len(recs) != 2 || recs[0].Name != "create-ride" || recs[1].Name != "charge" {
		t.Fatalf("after the failure: want create-ride and charge recorded, got %+v, %v", recs, err)
	}
	res, err := g.Do(ctx, call("ride-1"), ride.fn)
	if err != nil || string(res.Value) != "create-ride-ok charge-ok receipt-ok" || res.Replayed {
		t.Fatalf("retry: got %q, replayed %v, %v", res.Value, res.Replayed, err)
	}
	// The execution sees what was recorded, in order, through Recorded.
	_, _ = g.Do(ctx, call("ride-1b"), func(ctx context.Context, run idem.Run) ([]byte, error) {
		s := idem.StepsFrom(ctx)
		if _, err := s.Do(ctx, "first", func(context.Context, idem.Step) ([]byte, error) { return []byte("1"), nil }); err != nil {
			t.Error(err)
		}
		if _, err := idem.StepsOf(run).Do(ctx, "second", func(context.Context, idem.Step) ([]byte, error) { return []byte("2"), nil }); err != nil {
			t.Error(err)
		}
		recs, err := s.Recorded(ctx)
		if err != nil || len(recs) != 2 || recs[0].Name != "first" || recs[1].Seq != 2 || string(recs[1].Result) != "2" {
			t.Errorf("Recorded: %+v, %v", recs, err)
		}
		return nil, nil
	})
	res, err = g.Do(ctx, call("ride-1"), ride.fn)
	if err != nil || !res.Replayed || string(res.Value) != "create-ride-ok charge-ok receipt-ok" {
		t.Fatalf("third call: want the replay, got %q, %v", res.Value, err)
	}
	want := map[string]int{"create-ride": 1, "charge": 1, "receipt": 2}
	for name, n := range want {
		if ride.counts[name] != n {
			t.Errorf("step %s ran %d times, want %d", name, ride.counts[name], n)
		}
	}
	if ride.keys["charge"] != idem.DownstreamKey("test", "ride-1", "charge") || ride.keys["charge"] == ride.keys["receipt"] {
		t.Errorf("each step gets its own DownstreamKey, got %v", ride.keys)
	}
}

// A crashed execution (it recorded two steps and never completed) is taken
// over after its lease: the takeover runs only the last step.
func TestStepsTakeover(t *testing.T) {
	t.Parallel()
	store := idemtest.NewMemoryStore(nil)
	ctx := context.Background()
	c := call("ride-2")
	cl, err := store.Claim(ctx, idem.ClaimRequest{Scope: c.Scope, Key: c.Key, Fingerprint: c.Fingerprint, Lease: idem.MinLease})
	if err != nil || cl.Outcome != idem.Acquired {
		t.Fatal(cl, err)
	}
	for _, name := range []string{"create-ride", "charge"} {
		if _, err := store.RecordStep(ctx, idem.StepRequest{Scope: c.Scope, Key: c.Key, Token: cl.Token, Name: name,
			Result: []byte(name + "-crashed"), Retention: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(2 * idem.MinLease)
	ride := newRide()
	var takeover bool
	res, err := idem.NewGuard(store, nil).Do(ctx, c, func(ctx context.Context, run idem.Run) ([]byte, error) {
		takeover = run.Takeover
		return ride.fn(ctx, run)
	})
	if err != nil || string(res.Value) != "create-ride-crashed charge-crashed receipt-ok" {
		t.Fatalf("takeover: got %q, %v", res.Value, err)
	}
	if !takeover || ride.counts["create-ride"] != 0 || ride.counts["charge"] != 0 || ride.counts["receipt"] != 1 {
		t.Errorf("takeover %v, counts %v: want only the receipt to run", takeover, ride.counts)
	}
}

// Dozens of clients retry one operation whose steps fail at random: every
// step's effect happens exactly once and every client ends with the same
// final result.
func TestStepsConcurrentRetries(t *testing.T) {
	t.Parallel()
	const clients = 32
	store := idemtest.NewMemoryStore(nil)
	g := idem.NewGuard(store, &idem.GuardConfig{Wait: 30 * time.Second})
	var effects [3]atomic.Int32
	var rngMu sync.Mutex
	rng := rand.New(rand.NewPCG(1, 2))
	fail := func() bool {
		rngMu.Lock()
		defer rngMu.Unlock()
		return rng.IntN(3) == 0
	}
	fn := func(ctx context.Context, run idem.Run) ([]byte, error) {
		s := idem.StepsFrom(ctx)
		var out []byte
		for i, name := range []string{"create-ride", "charge", "receipt"} {
			v, err := s.Do(ctx, name, func(ctx context.Context, st idem.Step) ([]byte, error) {
				effects[i].Add(1)
				return []byte(name), nil
			})
			if err != nil {
				return nil, err
			}
			out = append(out, v...)
			if fail() { // a failure after the step: the retry must not redo it
				return nil, errors.New("transient")
			}
		}
		return out, nil
	}
	var wg sync.WaitGroup
	results := make([]string, clients)
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for attempt := 0; attempt < 1000; attempt++ {
				res, err := g.Do(context.Background(), call("ride-concurrent"), fn)
				if err == nil {
					results[i] = string(res.Value)
					return
				}
			}
			t.Errorf("client %d never got the result", i)
		}()
	}
	wg.Wait()
	for i := range effects {
		if n := effects[i].Load(); n != 1 {
			t.Errorf("step %d ran %d times, want 1", i, n)
		}
	}
	for i, r := range results {
		if r != "create-ridechargereceipt" {
			t.Errorf("client %d got %q", i, r)
		}
	}
}

func TestStepsErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	noop := func(context.Context, idem.Step) ([]byte, error) { return nil, nil }

	t.Run("RunNotFromGuard", func(t *testing.T) {
		_, err := idem.StepsOf(idem.Run{Scope: "s", Key: "k"}).Do(ctx, "a", noop)
		if !errors.Is(err, idem.ErrStepsUnsupported) {
			t.Errorf("want ErrStepsUnsupported, got %v", err)
		}
		if _, err := idem.StepsFrom(ctx).Recorded(ctx); !errors.Is(err, idem.ErrStepsUnsupported) {
			t.Errorf("StepsFrom a context without a Run: want ErrStepsUnsupported, got %v", err)
		}
	})
	t.Run("StoreWithoutSteps", func(t *testing.T) {
		g := idem.NewGuard(struct{ idem.Store }{idemtest.NewMemoryStore(nil)}, nil)
		_, err := g.Do(ctx, call("k"), func(ctx context.Context, run idem.Run) ([]byte, error) {
			return idem.StepsOf(run).Do(ctx, "a", noop)
		})
		if !errors.Is(err, idem.ErrStepsUnsupported) || !strings.Contains(err.Error(), "does not implement idem.StepStore") {
			t.Errorf("want ErrStepsUnsupported naming StepStore, got %v", err)
		}
	})
	t.Run("NoTxSteps", func(t *testing.T) {
		g := idem.NewGuard(idemtest.NewMemoryStore(nil), nil)
		_, err := g.Do(ctx, call("k"), func(ctx context.Context, run idem.Run) ([]byte, error) {
			return idem.DoTx(ctx, idem.StepsOf(run), "a", func(context.Context, *strings.Builder, idem.Step) ([]byte, error) {
				t.Error("fn ran")
				return nil, nil
			})
		})
		if !errors.Is(err, idem.ErrStepsUnsupported) || !strings.Contains(err.Error(), "*strings.Builder") {
			t.Errorf("want ErrStepsUnsupported naming the transaction type, got %v", err)
		}
	})
	t.Run("Bounds", func(t *testing.T) {
		store := idemtest.NewMemoryStore(nil)
		g := idem.NewGuard(store, nil)
		big := bytes.Repeat([]byte("x"), idem.MaxStepResultBytes+1)
		_, err := g.Do(ctx, call("bounds"), func(ctx context.Context, run idem.Run) ([]byte, error) {
			s := idem.StepsOf(run)
			for _, name := range []string{"", "white space", strings.Repeat("a", idem.MaxStepNameLen+1)} {
				if _, err := s.Do(ctx, name, func(context.Context, idem.Step) ([]byte, error) {
					t.Errorf("step %q ran", name)
					return nil, nil
				}); !errors.Is(err, idem.ErrInvalidStep) {
					t.Errorf("step name %q: want ErrInvalidStep, got %v", name, err)
				}
			}
			// A result over the limit is returned whole and recorded as a tombstone.
			if v, err := s.Do(ctx, "big", func(context.Context, idem.Step) ([]byte, error) { return big, nil }); err != nil || len(v) != len(big) {
				t.Errorf("big step: got %d bytes, %v", len(v), err)
			}
			for i := 1; i < idem.MaxSteps; i++ {
				if _, err := s.Do(ctx, fmt.Sprintf("s%d", i), noop); err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
			}
			if _, err := s.Do(ctx, "one-too-many", func(context.Context, idem.Step) ([]byte, error) {
				t.Error("the step beyond MaxSteps ran")
				return nil, nil
			}); !errors.Is(err, idem.ErrInvalidStep) {
				t.Errorf("step beyond MaxSteps: want ErrInvalidStep, got %v", err)
			}
			return nil, errors.New("release") // keep the steps, release the key
		})
		if err == nil {
			t.Fatal("want the release error")
		}
		_, err = g.Do(ctx, call("bounds"), func(ctx context.Context, run idem.Run) ([]byte, error) {
			return idem.StepsOf(run).Do(ctx, "big", noop)
		})
		if !errors.Is(err, idem.ErrResultDiscarded) {
			t.Errorf("a resumed tombstone step: want ErrResultDiscarded, got %v", err)
		}
	})
	t.Run("OtherPayload", func(t *testing.T) {
		store := idemtest.NewMemoryStore(nil)
		g := idem.NewGuard(store, nil)
		first := func(ctx context.Context, run idem.Run) ([]byte, error) {
			if _, err := idem.StepsOf(run).Do(ctx, "charge", noop); err != nil {
				return nil, err
			}
			return nil, errors.New("release")
		}
		_, _ = g.Do(ctx, call("reused"), first)
		other := call("reused")
		other.Fingerprint = idem.FingerprintBytes([]byte("another payload"))
		_, err := g.Do(ctx, other, func(ctx context.Context, run idem.Run) ([]byte, error) {
			return idem.StepsOf(run).Do(ctx, "charge", func(context.Context, idem.Step) ([]byte, error) {
				t.Error("a step of another payload's operation ran")
				return nil, nil
			})
		})
		if !errors.Is(err, idem.ErrFingerprintMismatch) {
			t.Errorf("want ErrFingerprintMismatch, got %v", err)
		}
	})
	t.Run("SameNameTwiceAtOnce", func(t *testing.T) {
		g := idem.NewGuard(idemtest.NewMemoryStore(nil), nil)
		_, err := g.Do(ctx, call("twice"), func(ctx context.Context, run idem.Run) ([]byte, error) {
			s := idem.StepsOf(run)
			return s.Do(ctx, "charge", func(ctx context.Context, _ idem.Step) ([]byte, error) {
				_, err := s.Do(ctx, "charge", noop)
				if !errors.Is(err, idem.ErrInvalidStep) {
					t.Errorf("a step run inside itself: want ErrInvalidStep, got %v", err)
				}
				return []byte("once"), nil
			})
		})
		if err != nil {
			t.Fatal(err)
		}
	})
	t.Run("LeaseLost", func(t *testing.T) {
		store := idemtest.NewMemoryStore(nil)
		g := idem.NewGuard(store, nil)
		ran := false
		_, err := g.Do(ctx, call("lost"), func(ctx context.Context, run idem.Run) ([]byte, error) {
			s := idem.StepsOf(run)
			v, err := s.Do(ctx, "charge", func(ctx context.Context, _ idem.Step) ([]byte, error) {
				// An operator deletes the key while the step runs.
				if err := store.Delete(ctx, run.Scope, run.Key); err != nil {
					t.Error(err)
				}
				return []byte("charged"), nil
			})
			if string(v) != "charged" || !errors.Is(err, idem.ErrNotRecorded) || !errors.Is(err, idem.ErrLeaseLost) {
				t.Errorf("want the step's result with ErrNotRecorded and ErrLeaseLost, got %q, %v", v, err)
			}
			_, err = s.Do(context.WithoutCancel(ctx), "receipt", func(context.Context, idem.Step) ([]byte, error) {
				ran = true
				return nil, nil
			})
			return nil, err
		})
		if !errors.Is(err, idem.ErrLeaseLost) {
			t.Errorf("want ErrLeaseLost, got %v", err)
		}
		if ran {
			t.Error("a step started after an earlier step's write found the lease lost")
		}
	})
}

// flakyStore fails the first RecordStep of every step with a retryable
// error after writing it, as a lost answer would.
type flakyStore struct {
	*idemtest.MemoryStore
	mu    sync.Mutex
	seen  map[string]bool
	fails int
}

func (f *flakyStore) RecordStep(ctx context.Context, req idem.StepRequest) (idem.StepRecord, error) {
	rec, err := f.MemoryStore.RecordStep(ctx, req)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil && !f.seen[req.Name] {
		f.seen[req.Name] = true
		f.fails++
		return idem.StepRecord{}, idem.Retryable(errors.New("connection reset after the write"))
	}
	return rec, err
}

func TestStepsRecordRetried(t *testing.T) {
	t.Parallel()
	store := &flakyStore{MemoryStore: idemtest.NewMemoryStore(nil), seen: map[string]bool{}}
	ride := newRide()
	res, err := idem.NewGuard(store, nil).Do(context.Background(), call("flaky"), ride.fn)
	if err != nil || string(res.Value) != "create-ride-ok charge-ok receipt-ok" {
		t.Fatalf("got %q, %v", res.Value, err)
	}
	if store.fails != 3 || ride.counts["charge"] != 1 {
		t.Errorf("want each record retried once and each step run once, got %d failures, counts %v", store.fails, ride.counts)
	}
}
