package idemtest_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest"
)

// The full Store contract is checked by idemtest/storetest against this
// store; these tests cover what needs a manual clock or the memory store's
// own promises.

var t0 = time.Date(2026, 3, 29, 0, 59, 0, 0, time.UTC)

func newStore(t *testing.T, maxResult int) (*idemtest.MemoryStore, *idemtest.Clock) {
	t.Helper()
	clock := idemtest.NewClock(t0)
	return idemtest.NewMemoryStore(&idemtest.MemoryOptions{Now: clock.Now, MaxResultBytes: maxResult}), clock
}

func mustClaim(t *testing.T, s idem.Store, key string, lease time.Duration, want idem.Outcome) idem.Claim {
	t.Helper()
	c, err := s.Claim(context.Background(), idem.ClaimRequest{Scope: "s", Key: key, Lease: lease})
	if err != nil {
		t.Fatalf("Claim(%q): %v", key, err)
	}
	if c.Outcome != want {
		t.Fatalf("Claim(%q): want %v, got %v", key, want, c.Outcome)
	}
	return c
}

func mustComplete(t *testing.T, s idem.Store, key string, token int64, result []byte, retention time.Duration) {
	t.Helper()
	err := s.Complete(context.Background(), idem.CompleteRequest{Scope: "s", Key: key, Token: token, Result: result, Retention: retention})
	if err != nil {
		t.Fatalf("Complete(%q): %v", key, err)
	}
}

func TestMemoryStoreIsNotDurable(t *testing.T) {
	t.Parallel()
	s := idemtest.NewMemoryStore(nil)
	if s.Durable() || idem.IsDurable(s) {
		t.Fatal("a memory store must report that it is not durable")
	}
}

func TestMemoryStoreLeaseFollowsClock(t *testing.T) {
	t.Parallel()
	s, clock := newStore(t, 0)
	c1 := mustClaim(t, s, "k", time.Minute, idem.Acquired)
	if !c1.LeaseExpiresAt.Equal(t0.Add(time.Minute)) {
		t.Errorf("lease expiry: want %v, got %v", t0.Add(time.Minute), c1.LeaseExpiresAt)
	}
	clock.Advance(time.Minute - time.Nanosecond)
	mustClaim(t, s, "k", time.Minute, idem.InProgress)
	clock.Advance(time.Nanosecond)
	c2 := mustClaim(t, s, "k", time.Minute, idem.Acquired)
	if !c2.Takeover || c2.Token <= c1.Token {
		t.Errorf("a claim at the lease's expiry takes over with a greater token: got %+v after %+v", c2, c1)
	}
}

func TestMemoryStoreExpiredLeaseMayStillComplete(t *testing.T) {
	t.Parallel()
	s, clock := newStore(t, 0)
	c := mustClaim(t, s, "k", time.Second, idem.Acquired)
	clock.Advance(time.Hour)
	exp, err := s.Extend(context.Background(), "s", "k", c.Token, time.Minute)
	if err != nil || !exp.Equal(clock.Now().Add(time.Minute)) {
		t.Fatalf("Extend of an expired lease nobody took over: got %v, %v", exp, err)
	}
	mustComplete(t, s, "k", c.Token, []byte("late"), time.Hour)
}

func TestMemoryStoreRetentionFollowsClock(t *testing.T) {
	t.Parallel()
	s, clock := newStore(t, 0)
	ctx := context.Background()
	c := mustClaim(t, s, "k", time.Minute, idem.Acquired)
	clock.Advance(time.Second)
	mustComplete(t, s, "k", c.Token, []byte("r"), 30*24*time.Hour)
	r, err := s.Get(ctx, "s", "k")
	if err != nil {
		t.Fatal(err)
	}
	if !r.CreatedAt.Equal(t0) || !r.CompletedAt.Equal(t0.Add(time.Second)) || !r.ExpiresAt.Equal(t0.Add(time.Second+30*24*time.Hour)) {
		t.Errorf("times come from the clock: got created %v, completed %v, expires %v", r.CreatedAt, r.CompletedAt, r.ExpiresAt)
	}
	clock.Set(r.ExpiresAt.Add(-time.Nanosecond))
	mustClaim(t, s, "k", time.Minute, idem.Completed)
	clock.Set(r.ExpiresAt)
	if _, err := s.Get(ctx, "s", "k"); err != nil {
		t.Errorf("Get returns an expired record that was not purged: %v", err)
	}
	again := mustClaim(t, s, "k", time.Minute, idem.Acquired)
	if again.Takeover || again.Token <= c.Token {
		t.Errorf("an expired completed record counts as absent: got %+v", again)
	}
}

func TestMemoryStoreTokensAreGlobal(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, 0)
	var last int64
	for i := range 10 {
		c := mustClaim(t, s, fmt.Sprintf("k%d", i), time.Minute, idem.Acquired)
		if c.Token <= last {
			t.Fatalf("tokens strictly increase across keys: %d after %d", c.Token, last)
		}
		last = c.Token
	}
}

func TestMemoryStorePurgeBatches(t *testing.T) {
	t.Parallel()
	s, clock := newStore(t, 0)
	ctx := context.Background()
	for i := range 10 {
		key := fmt.Sprintf("k%d", i)
		c := mustClaim(t, s, key, time.Minute, idem.Acquired)
		mustComplete(t, s, key, c.Token, nil, time.Duration(i+1)*time.Minute)
	}
	mustClaim(t, s, "live", time.Second, idem.Acquired)
	clock.Advance(7 * time.Minute)
	if n, err := s.Purge(ctx, 3); err != nil || n != 7 {
		t.Fatalf("Purge(3) after 7 minutes: want 7, got %d, %v", n, err)
	}
	clock.Advance(time.Hour)
	if n, err := s.Purge(ctx, 0); err != nil || n != 3 {
		t.Fatalf("Purge(0) removes the rest of the completed records: want 3, got %d, %v", n, err)
	}
	if _, err := s.Get(ctx, "s", "live"); err != nil {
		t.Errorf("Purge never removes a record in progress, even with an expired lease: %v", err)
	}
	if _, err := s.Purge(ctx, -1); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("Purge with a negative limit: want ErrInvalidConfig, got %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.Purge(cctx, 0); !errors.Is(err, context.Canceled) {
		t.Errorf("Purge with a cancelled context: want context.Canceled, got %v", err)
	}
}

func TestMemoryStoreTombstone(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, 8)
	c := mustClaim(t, s, "big", time.Minute, idem.Acquired)
	mustComplete(t, s, "big", c.Token, []byte("123456789"), time.Hour)
	replay := mustClaim(t, s, "big", time.Minute, idem.Completed)
	if !replay.Record.Tombstone || replay.Record.Result != nil {
		t.Errorf("a result over MaxResultBytes makes a tombstone, got %+v", replay.Record)
	}
}

// Results are copied in and out, so neither the caller's buffer nor a
// returned record can change what the store replays.
func TestMemoryStoreCopiesResults(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, 0)
	result := []byte("original")
	c := mustClaim(t, s, "k", time.Minute, idem.Acquired)
	mustComplete(t, s, "k", c.Token, result, time.Hour)
	result[0] = 'X'
	r, err := s.Get(context.Background(), "s", "k")
	if err != nil {
		t.Fatal(err)
	}
	r.Result[1] = 'Y'
	replay := mustClaim(t, s, "k", time.Minute, idem.Completed)
	if !bytes.Equal(replay.Record.Result, []byte("original")) {
		t.Errorf("stored result changed through an alias: %q", replay.Record.Result)
	}
}

func TestClock(t *testing.T) {
	t.Parallel()
	c := idemtest.NewClock(t0)
	if got := c.Advance(time.Hour); !got.Equal(t0.Add(time.Hour)) || !c.Now().Equal(got) {
		t.Errorf("Advance: got %v, Now %v", got, c.Now())
	}
	c.Set(t0)
	if !c.Now().Equal(t0) {
		t.Errorf("Set: got %v", c.Now())
	}
}
