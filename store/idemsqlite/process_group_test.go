package idemsqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest/storetest"
)

// holdWrites takes s's write lock, so that every Process started meanwhile
// queues for a shared transaction, and returns release, which waits until
// n writes are queued and then lets them all go (into one transaction:
// fewer than maxSharedOps).
func holdWrites(t *testing.T, s *Store) (release func(n int)) {
	t.Helper()
	if err := s.writes.lock(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func(n int) {
		once.Do(func() {
			defer s.writes.unlock()
			waitPending(t, s, atLeast(n))
		})
	}
	t.Cleanup(func() { release(0) })
	return release
}

type ctxKey struct{}

// Dozens of Process calls in one shared transaction: a failing handler and
// a panicking one roll back only their own message, two deliveries of one
// key inside the group yield one Processed and one Duplicate, each handler
// runs on its caller's goroutine with its caller's ctx, and everything
// else commits with one commit.
func TestProcessSharedHandlerFailuresAndPanics(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, nil)
	createEffects(t, s.DB())
	const n = 48
	release := holdWrites(t, s)
	batches := s.batches.Load()

	type result struct {
		out      idem.Outcome
		err      error
		panicked any
	}
	results := make([]result, n)
	key := func(i int) string {
		if i%4 == 3 {
			return fmt.Sprint("k", i-3) // a second delivery of an ok message
		}
		return fmt.Sprint("k", i)
	}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			defer func() { results[i].panicked = recover() }()
			ctx := context.WithValue(context.Background(), ctxKey{}, i)
			msg := idem.Message{Scope: "shared", Key: key(i)}
			results[i].out, results[i].err = s.Process(ctx, msg, func(ctx context.Context, tx *sql.Tx) error {
				if got := ctx.Value(ctxKey{}); got != i {
					return fmt.Errorf("handler %d got the ctx of %v", i, got)
				}
				if err := insertEffect(ctx, tx, msg.Key); err != nil {
					return err
				}
				switch i % 4 {
				case 1:
					return errors.New("handler failed")
				case 2:
					panic(fmt.Sprint("handler ", i, " panicked"))
				}
				return nil
			})
		})
	}
	release(n)
	wg.Wait()
	if got := s.batches.Load() - batches; got != 1 {
		t.Errorf("%d transactions for %d queued calls, want 1", got, n)
	}

	ctx := context.Background()
	for i := range n {
		r := results[i]
		switch i % 4 {
		case 0, 3:
			if r.err != nil || r.panicked != nil {
				t.Errorf("call %d: %v, %v, panic %v", i, r.out, r.err, r.panicked)
			}
		case 1:
			if r.out != "" || r.err == nil || !strings.Contains(r.err.Error(), "handler failed") {
				t.Errorf("failing call %d: %v, %v; want its handler's error", i, r.out, r.err)
			}
		case 2:
			if r.panicked != fmt.Sprint("handler ", i, " panicked") {
				t.Errorf("panicking call %d: recovered %v", i, r.panicked)
			}
		}
		if i%4 == 3 {
			a, b := results[i-3].out, r.out
			if !(a == idem.Processed && b == idem.Duplicate) && !(a == idem.Duplicate && b == idem.Processed) {
				t.Errorf("two deliveries of %s in one group: %v and %v, want one Processed, one Duplicate", key(i), a, b)
			}
		}
		if i%4 == 1 || i%4 == 2 {
			if _, err := s.Get(ctx, "shared", key(i)); !errors.Is(err, idem.ErrNotFound) {
				t.Errorf("call %d rolled back, but its record: %v", i, err)
			}
		}
	}
	effects, err := countEffects(ctx, s.DB())
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		want := 1
		if i%4 == 1 || i%4 == 2 {
			want = 0
		}
		if effects[key(i)] != want {
			t.Errorf("%s: %d effects, want %d", key(i), effects[key(i)], want)
		}
	}

	// The redeliveries of the rolled-back messages run their handlers.
	for i := range n {
		if i%4 != 1 && i%4 != 2 {
			continue
		}
		out, err := s.Process(ctx, idem.Message{Scope: "shared", Key: key(i)}, func(ctx context.Context, tx *sql.Tx) error {
			return insertEffect(ctx, tx, key(i))
		})
		if out != idem.Processed || err != nil {
			t.Errorf("redelivery of %d: %v, %v", i, out, err)
		}
	}
	if effects, err = countEffects(ctx, s.DB()); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if effects[key(i)] != 1 {
			t.Errorf("%s: %d effects after the redeliveries, want 1", key(i), effects[key(i)])
		}
	}
}

// A shared commit that fails fails every message in it: nothing of any of
// them is recorded, and each caller gets the commit's error. The failure is
// a deferred foreign key that one handler violates: SQLite checks it at
// COMMIT, not when the handler's savepoint is released.
func TestProcessSharedCommitFailure(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, nil)
	createEffects(t, s.DB())
	ctx := context.Background()
	for _, q := range []string{
		"CREATE TABLE parents (id INTEGER PRIMARY KEY)",
		"CREATE TABLE children (parent INTEGER REFERENCES parents (id) DEFERRABLE INITIALLY DEFERRED)",
	} {
		if _, err := s.DB().ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	const n = 32
	release := holdWrites(t, s)
	outs, errs := make([]idem.Outcome, n), make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			msg := idem.Message{Scope: "commit", Key: fmt.Sprint("k", i)}
			outs[i], errs[i] = s.Process(ctx, msg, func(ctx context.Context, tx *sql.Tx) error {
				if i == n/2 {
					_, err := tx.ExecContext(ctx, "INSERT INTO children (parent) VALUES (42)")
					return err
				}
				return insertEffect(ctx, tx, msg.Key)
			})
		})
	}
	release(n)
	wg.Wait()
	for i := range n {
		if outs[i] != "" || errs[i] == nil || !strings.Contains(errs[i].Error(), "commit") {
			t.Errorf("call %d: %v, %v; want the commit's error", i, outs[i], errs[i])
		}
		if _, err := s.Get(ctx, "commit", fmt.Sprint("k", i)); !errors.Is(err, idem.ErrNotFound) {
			t.Errorf("call %d failed to commit, but its record: %v", i, err)
		}
	}
	effects, err := countEffects(ctx, s.DB())
	if err != nil {
		t.Fatal(err)
	}
	if len(effects) != 0 {
		t.Errorf("effects after a failed commit: %v", effects)
	}
	// The store goes on: a redelivery commits.
	msg := idem.Message{Scope: "commit", Key: "k0"}
	if out, err := s.Process(ctx, msg, func(ctx context.Context, tx *sql.Tx) error { return insertEffect(ctx, tx, msg.Key) }); out != idem.Processed || err != nil {
		t.Fatalf("redelivery after the failed commit: %v, %v", out, err)
	}
}

// A call whose ctx ends while it waits for a shared transaction returns
// the context's error; its handler never runs and nothing is recorded. The
// calls queued beside it are not disturbed.
func TestProcessSharedCanceledWhileQueued(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, nil)
	createEffects(t, s.DB())
	const n = 40
	release := holdWrites(t, s)
	outs, errs := make([]idem.Outcome, n), make([]error, n)
	cancels := make([]context.CancelFunc, n)
	var ran sync.Map
	var wg sync.WaitGroup
	for i := range n {
		ctx, cancel := context.WithCancel(context.Background())
		cancels[i] = cancel
		defer cancel()
		wg.Go(func() {
			msg := idem.Message{Scope: "cancel", Key: fmt.Sprint("k", i)}
			outs[i], errs[i] = s.Process(ctx, msg, func(ctx context.Context, tx *sql.Tx) error {
				ran.Store(i, true)
				return insertEffect(ctx, tx, msg.Key)
			})
		})
	}
	waitPending(t, s, atLeast(n))
	for i := 0; i < n; i += 2 {
		cancels[i]()
	}
	waitPending(t, s, atMost(n/2))
	release(n / 2)
	wg.Wait()
	ctx := context.Background()
	for i := range n {
		_, err := s.Get(ctx, "cancel", fmt.Sprint("k", i))
		_, handled := ran.Load(i)
		if i%2 == 0 {
			if outs[i] != "" || !errors.Is(errs[i], context.Canceled) || handled || !errors.Is(err, idem.ErrNotFound) {
				t.Errorf("cancelled call %d: %v, %v, handler ran %v, record %v", i, outs[i], errs[i], handled, err)
			}
			continue
		}
		if outs[i] != idem.Processed || errs[i] != nil || !handled || err != nil {
			t.Errorf("call %d: %v, %v, handler ran %v, record %v", i, outs[i], errs[i], handled, err)
		}
	}
}

// A handler that ends the shared transaction (a misuse: fn must leave tx
// open) cannot make the others' outcomes lie: every call in the group
// fails with an error wrapping idem.ErrCommitUnknown, nothing hangs, and
// redeliveries settle each message exactly once.
func TestProcessSharedHandlerEndsTheTransaction(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, nil)
	createEffects(t, s.DB())
	ctx := context.Background()
	const n = 24
	release := holdWrites(t, s)
	errs := make([]error, n)
	var wg sync.WaitGroup
	handler := func(i int) func(ctx context.Context, tx *sql.Tx) error {
		return func(ctx context.Context, tx *sql.Tx) error {
			if err := insertEffect(ctx, tx, fmt.Sprint("k", i)); err != nil {
				return err
			}
			if i == n/2 {
				return tx.Commit()
			}
			return nil
		}
	}
	for i := range n {
		wg.Go(func() {
			_, errs[i] = s.Process(ctx, idem.Message{Scope: "ends", Key: fmt.Sprint("k", i)}, handler(i))
		})
	}
	release(n)
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, idem.ErrCommitUnknown) {
			t.Errorf("call %d: %v; want ErrCommitUnknown", i, err)
		}
	}
	for i := range n {
		out, err := s.Process(ctx, idem.Message{Scope: "ends", Key: fmt.Sprint("k", i)}, func(ctx context.Context, tx *sql.Tx) error {
			return insertEffect(ctx, tx, fmt.Sprint("k", i))
		})
		if err != nil || (out != idem.Processed && out != idem.Duplicate) {
			t.Errorf("redelivery %d: %v, %v", i, out, err)
		}
	}
	effects, err := countEffects(ctx, s.DB())
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if k := fmt.Sprint("k", i); effects[k] != 1 {
			t.Errorf("%s: %d effects, want 1", k, effects[k])
		}
	}
}

// sharedEnv runs the transactional-path suite through shared transactions:
// each Process finds the write lock taken, so it queues for a group
// instead of running alone.
type sharedEnv struct{ processEnv }

func (e sharedEnv) Process(ctx context.Context, msg idem.Message, fail error) (idem.Outcome, error) {
	s := e.s
	if err := s.writes.lock(ctx, false); err != nil {
		return "", err
	}
	released := make(chan struct{})
	go func() {
		defer close(released)
		defer s.writes.unlock()
		for range 1000 {
			s.holders.mu.Lock()
			queued := len(s.holders.pending)
			s.holders.mu.Unlock()
			if queued > 0 || ctx.Err() != nil {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	defer func() { <-released }()
	return e.processEnv.Process(ctx, msg, fail)
}

func TestProcessSharedConformance(t *testing.T) {
	t.Parallel()
	storetest.RunProcess(t, func(t *testing.T) storetest.ProcessEnv {
		return sharedEnv{newProcessEnv(t).(processEnv)}
	})
}

// Process calls, claims and completions running at once share
// transactions with one another: every delivery settles (Processed once per
// key, Duplicate for the rest), every claim acquires and completes, and no
// call hangs.
func TestProcessSharesWithClaimsAndCompletions(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, nil)
	createEffects(t, s.DB())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const consumers, perConsumer, claimers, perClaimer = 24, 20, 8, 20
	var (
		mu        sync.Mutex
		processed = map[string]int{}
		wg        sync.WaitGroup
	)
	for c := range consumers {
		wg.Go(func() {
			for i := range perConsumer {
				// Neighbouring consumers deliver some keys twice.
				key := fmt.Sprint("m", c*perConsumer+i)
				if i%3 == 0 && c > 0 {
					key = fmt.Sprint("m", (c-1)*perConsumer+i)
				}
				out, err := s.Process(ctx, idem.Message{Scope: "mixed", Key: key}, func(ctx context.Context, tx *sql.Tx) error {
					return insertEffect(ctx, tx, key)
				})
				if err != nil || (out != idem.Processed && out != idem.Duplicate) {
					t.Errorf("process %s: %v, %v", key, out, err)
					return
				}
				if out == idem.Processed {
					mu.Lock()
					processed[key]++
					mu.Unlock()
				}
			}
		})
	}
	for c := range claimers {
		wg.Go(func() {
			for i := range perClaimer {
				key := fmt.Sprint("c", c, "-", i)
				cl, err := s.Claim(ctx, idem.ClaimRequest{Scope: "mixed-claims", Key: key, Lease: time.Minute})
				if err != nil || cl.Outcome != idem.Acquired {
					t.Errorf("claim %s: %+v, %v", key, cl, err)
					return
				}
				if err := s.Complete(ctx, idem.CompleteRequest{Scope: "mixed-claims", Key: key, Token: cl.Token, Result: []byte("ok"), Retention: time.Hour}); err != nil {
					t.Errorf("complete %s: %v", key, err)
					return
				}
			}
		})
	}
	wg.Wait()
	effects, err := countEffects(ctx, s.DB())
	if err != nil {
		t.Fatal(err)
	}
	for key, n := range processed {
		if n != 1 || effects[key] != 1 {
			t.Errorf("%s: Processed %d times, %d effects; want 1 and 1", key, n, effects[key])
		}
	}
	if len(effects) != len(processed) {
		t.Errorf("%d keys with effects, %d Processed", len(effects), len(processed))
	}
	t.Logf("%d shared transactions", s.batches.Load())
}
