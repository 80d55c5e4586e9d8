package idemsqlite

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// Claims and completions that queue while a write runs share the next
// transaction (group commit): 48 new keys, 16 claims racing for one more
// key and 16 completions, one commit. Each caller still gets its own
// answer: distinct tokens, exactly one winner of the raced key, every
// completion kept.
func TestClaimsShareATransaction(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, nil)
	ctx := context.Background()
	const done = 16
	tokens := make([]int64, done)
	for i := range done {
		c, err := s.Claim(ctx, idem.ClaimRequest{Scope: "group", Key: fmt.Sprint("done-", i), Lease: time.Minute})
		if err != nil || c.Outcome != idem.Acquired {
			t.Fatalf("claim %d: %+v %v", i, c, err)
		}
		tokens[i] = c.Token
	}
	if err := s.writes.lock(ctx, false); err != nil {
		t.Fatal(err)
	}
	const fresh, raced = 48, 16
	claims := make([]idem.Claim, fresh+raced)
	errs := make([]error, fresh+raced+done)
	var wg sync.WaitGroup
	keys := make([]string, fresh+raced)
	for i := range keys {
		keys[i] = "raced"
		if i < fresh {
			keys[i] = fmt.Sprint("new-", i)
		}
	}
	for i := range fresh + raced {
		wg.Go(func() {
			claims[i], errs[i] = s.Claim(ctx, idem.ClaimRequest{Scope: "group", Key: keys[i], Lease: time.Minute})
		})
	}
	for i := range done {
		wg.Go(func() {
			errs[fresh+raced+i] = s.Complete(ctx, idem.CompleteRequest{Scope: "group", Key: fmt.Sprint("done-", i),
				Token: tokens[i], Result: []byte("ok"), Retention: time.Hour})
		})
	}
	waitPending(t, s, atLeast(fresh+raced+done))
	before := s.batches.Load()
	s.writes.unlock()
	wg.Wait()
	if got := s.batches.Load() - before; got != 1 {
		t.Errorf("%d shared transactions for %d queued writes, want 1", got, fresh+raced+done)
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	seen := map[int64]bool{}
	winners := 0
	for i, c := range claims {
		switch {
		case i < fresh && c.Outcome != idem.Acquired:
			t.Errorf("claim of a new key: %+v", c)
		case i >= fresh && c.Outcome == idem.Acquired:
			winners++
		case i >= fresh && c.Outcome != idem.InProgress:
			t.Errorf("losing claim of the raced key: %+v, want in_progress", c)
		}
		if c.Outcome == idem.Acquired {
			if seen[c.Token] {
				t.Errorf("token %d handed out twice", c.Token)
			}
			seen[c.Token] = true
			rec, err := s.Get(ctx, "group", keys[i])
			if err != nil || rec.State != idem.StateInProgress || rec.Token != c.Token {
				t.Errorf("record of claim %d: %+v %v", i, rec, err)
			}
		}
	}
	if winners != 1 {
		t.Errorf("%d claims of the raced key acquired it, want 1", winners)
	}
	for i := range done {
		rec, err := s.Get(ctx, "group", fmt.Sprint("done-", i))
		if err != nil || rec.State != idem.StateCompleted || string(rec.Result) != "ok" {
			t.Errorf("completed record %d: %+v %v", i, rec, err)
		}
	}
	// Tokens keep increasing after the shared transaction.
	c, err := s.Claim(ctx, idem.ClaimRequest{Scope: "group", Key: "after", Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for tok := range seen {
		if c.Token <= tok {
			t.Fatalf("token %d after the batch is not above %d", c.Token, tok)
		}
	}
}

// A claim whose caller gave up while it queued leaves the queue and
// acquires nothing; the others of its transaction are unaffected.
func TestQueuedClaimCancelled(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, nil)
	ctx := context.Background()
	if err := s.writes.lock(ctx, false); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	var (
		wg           sync.WaitGroup
		cancelledErr error
		kept         idem.Claim
		keptErr      error
	)
	wg.Go(func() {
		_, cancelledErr = s.Claim(cctx, idem.ClaimRequest{Scope: "group", Key: "gone", Lease: time.Minute})
	})
	wg.Go(func() {
		kept, keptErr = s.Claim(ctx, idem.ClaimRequest{Scope: "group", Key: "kept", Lease: time.Minute})
	})
	waitPending(t, s, atLeast(2))
	cancel()
	waitPending(t, s, atMost(1))
	s.writes.unlock()
	wg.Wait()
	if cancelledErr == nil || keptErr != nil || kept.Outcome != idem.Acquired {
		t.Fatalf("cancelled claim: %v; kept claim: %+v %v", cancelledErr, kept, keptErr)
	}
	if _, err := s.Get(ctx, "group", "gone"); err == nil {
		t.Fatal("the cancelled claim left a record")
	}
}

// The claim and complete paths prepare their statements once, from dozens
// of goroutines at a time, and Close closes them.
func TestHotStatementsPreparedOnce(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, nil)
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Go(func() {
			c, err := s.Claim(ctx, idem.ClaimRequest{Scope: "hot", Key: fmt.Sprint(i), Lease: time.Minute})
			if err == nil {
				err = s.Complete(ctx, idem.CompleteRequest{Scope: "hot", Key: fmt.Sprint(i), Token: c.Token, Result: []byte("r"), Retention: time.Hour})
			}
			if err != nil {
				t.Error(err)
			}
			if c, err := s.Claim(ctx, idem.ClaimRequest{Scope: "hot", Key: fmt.Sprint(i), Lease: time.Minute}); err != nil || c.Outcome != idem.Completed {
				t.Errorf("replay claim: %+v %v", c, err)
			}
		})
	}
	wg.Wait()
	s.stmts.settle()
	s.stmts.mu.Lock()
	n := len(s.stmts.m)
	s.stmts.mu.Unlock()
	if n != 4 { // read, token, insert, complete
		t.Errorf("%d prepared statements, want 4", n)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if len(s.stmts.m) != 0 {
		t.Errorf("%d statements left open after Close", len(s.stmts.m))
	}
	if _, err := s.Claim(ctx, idem.ClaimRequest{Scope: "hot", Key: "after", Lease: time.Minute}); !errors.Is(err, idem.ErrClosed) {
		t.Errorf("claim after Close: %v", err)
	}
}
