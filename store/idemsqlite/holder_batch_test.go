package idemsqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// waitPending waits until the number of queued lease-holder writes meets c.
func waitPending(t *testing.T, s *Store, c pendingCond) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		s.holders.mu.Lock()
		got := len(s.holders.pending)
		s.holders.mu.Unlock()
		if c.ok(got) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d holder writes queued, want %s", got, c.what)
		}
		time.Sleep(time.Millisecond)
	}
}

// pendingCond is a condition for waitPending.
type pendingCond struct {
	what string
	ok   func(queued int) bool
}

func atLeast(n int) pendingCond {
	return pendingCond{fmt.Sprint("at least ", n), func(got int) bool { return got >= n }}
}

func atMost(n int) pendingCond {
	return pendingCond{fmt.Sprint("at most ", n), func(got int) bool { return got <= n }}
}

// Lease holders that queue while a write runs share the next transaction:
// 200 heartbeats, one commit. Each still gets its own answer: the stale
// tokens ErrLeaseLost, a cancelled caller its context's error, the others
// their new expiry.
func TestHolderWritesShareATransaction(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, nil)
	ctx := context.Background()
	const n = 200
	tokens := make([]int64, n)
	for i := range n {
		c, err := s.Claim(ctx, idem.ClaimRequest{Scope: "batch", Key: fmt.Sprint(i), Lease: time.Minute})
		if err != nil || c.Outcome != idem.Acquired {
			t.Fatalf("claim %d: %+v %v", i, c, err)
		}
		tokens[i] = c.Token
	}
	// Hold the write lock so that every heartbeat queues.
	if err := s.writes.lock(ctx, false); err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			token, c := tokens[i], ctx
			switch {
			case i%10 == 3:
				token-- // stale
			case i == 7:
				c = cancelled
			}
			_, errs[i] = s.Extend(c, "batch", fmt.Sprint(i), token, time.Hour)
		})
	}
	waitPending(t, s, atLeast(n))
	cancel() // i == 7 gives up while it waits: it leaves the queue
	waitPending(t, s, atMost(n-1))
	before := s.batches.Load()
	s.writes.unlock()
	wg.Wait()
	if got := s.batches.Load() - before; got != 1 {
		t.Errorf("%d holder transactions for %d queued heartbeats, want 1", got, n-1)
	}
	for i, err := range errs {
		switch {
		case i == 7:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("cancelled heartbeat: %v", err)
			}
		case i%10 == 3:
			if !errors.Is(err, idem.ErrLeaseLost) {
				t.Errorf("stale heartbeat %d: %v, want ErrLeaseLost", i, err)
			}
		default:
			if err != nil {
				t.Errorf("heartbeat %d: %v", i, err)
			}
			rec, gerr := s.Get(ctx, "batch", fmt.Sprint(i))
			if gerr != nil || time.Until(rec.LeaseExpiresAt) < 30*time.Minute {
				t.Errorf("record %d after its heartbeat: %+v %v", i, rec, gerr)
			}
		}
	}
}

// A write in a shared transaction that fails for another reason than a
// lost lease rolls the whole transaction back: nobody's write is kept, and
// every caller hears why.
func TestHolderBatchFailureRollsBackAll(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, nil)
	ctx := context.Background()
	c, err := s.Claim(ctx, idem.ClaimRequest{Scope: "batch", Key: "k", Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	before, err := s.Get(ctx, "batch", "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.writes.lock(ctx, false); err != nil {
		t.Fatal(err)
	}
	var extendErr, badErr error
	var wg sync.WaitGroup
	wg.Go(func() { _, extendErr = s.Extend(ctx, "batch", "k", c.Token, time.Hour) })
	waitPending(t, s, atLeast(1))
	boom := errors.New("disk on fire")
	wg.Go(func() {
		badErr = s.inHolderTx(ctx, "broken", func(context.Context, *sql.Tx, int64) error { return boom })
	})
	waitPending(t, s, atLeast(2))
	s.writes.unlock()
	wg.Wait()
	if !errors.Is(badErr, boom) || !errors.Is(extendErr, boom) {
		t.Fatalf("errors %v / %v, want both to carry the failure", extendErr, badErr)
	}
	after, err := s.Get(ctx, "batch", "k")
	if err != nil || !after.LeaseExpiresAt.Equal(before.LeaseExpiresAt) {
		t.Fatalf("the rolled-back heartbeat changed the record: %v → %v (%v)", before.LeaseExpiresAt, after.LeaseExpiresAt, err)
	}
	// The store goes on working.
	if _, err := s.Extend(ctx, "batch", "k", c.Token, time.Hour); err != nil {
		t.Fatalf("extend after a failed shared transaction: %v", err)
	}
}
