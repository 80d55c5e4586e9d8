package storetest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// expiryTest is a subtest that needs a lease or a retention to pass. It
// is split in two so that all of them share a single wait: go test runs
// only GOMAXPROCS parallel subtests at once, so on a small machine five
// parallel subtests that each slept would pay for several waits.
type expiryTest struct {
	name string
	// setup prepares records with shortTTL leases or retentions on s and
	// returns the checks to run once expiryWait has passed.
	setup func(t *testing.T, s idem.Store, c config) (check func(t *testing.T))
}

var expiryTests = []expiryTest{
	{"LeaseExpiryTakeover", setupLeaseExpiryTakeover},
	{"ExpiredLeaseWithoutTakeover", setupExpiredLeaseWithoutTakeover},
	{"TokensIncreaseAcrossDeleteAndPurge", setupTokensAcrossDeleteAndPurge},
	{"RetentionExpiry", setupRetentionExpiry},
	{"Purge", setupPurge},
}

// testExpiry runs every expiry test, each on its own store, around one wait.
func testExpiry(t *testing.T, newStore func(t *testing.T) idem.Store, c config) {
	checks := make([]func(t *testing.T), len(expiryTests))
	for i, et := range expiryTests {
		// The store belongs to this test, not to the Setup subtest, so that
		// its cleanups run after the checks.
		s := newStore(t)
		t.Run(et.name+"/Setup", func(t *testing.T) {
			checks[i] = et.setup(t, s, c)
		})
	}
	time.Sleep(expiryWait)
	for i, et := range expiryTests {
		if checks[i] == nil {
			continue // its setup failed and said why
		}
		t.Run(et.name, checks[i])
	}
}

func setupLeaseExpiryTakeover(t *testing.T, s idem.Store, _ config) func(t *testing.T) {
	f := fp("takeover")
	c1 := acquire(t, s, claimReq("takeover", f, shortTTL))
	wantOutcome(t, claim(t, s, claimReq("takeover", f, shortTTL)), idem.InProgress, "a claim before the lease expires")
	acquire(t, s, claimReq("takeover-mismatch", fp("A"), shortTTL))
	return func(t *testing.T) {
		c2 := acquire(t, s, claimReq("takeover", f, longLease))
		if !c2.Takeover {
			t.Error("contract: a claim after the lease expired must be Acquired with Takeover=true")
		}
		if c2.Token <= c1.Token {
			t.Errorf("contract: a takeover must get a strictly greater token: %d then %d", c1.Token, c2.Token)
		}
		wantLeaseLost(t, s, "takeover", c1.Token, "by the holder whose lease was taken over")
		complete(t, s, "takeover", c2.Token, []byte("second"), longRetention)
		if r := get(t, s, scope, "takeover"); r.Token != c2.Token || string(r.Result) != "second" {
			t.Errorf("contract: the new holder's Complete must stick (token %d, result second), got token %d, result %q", c2.Token, r.Token, r.Result)
		}
		m := claim(t, s, claimReq("takeover-mismatch", fp("B"), longLease))
		wantOutcome(t, m, idem.Mismatch, "a claim with another fingerprint on an expired lease (a mismatch whatever the state)")
	}
}

func setupExpiredLeaseWithoutTakeover(t *testing.T, s idem.Store, _ config) func(t *testing.T) {
	cl := acquire(t, s, claimReq("late", fp("late"), shortTTL))
	return func(t *testing.T) {
		err := s.Complete(context.Background(), idem.CompleteRequest{Scope: scope, Key: "late", Token: cl.Token, Result: []byte("late"), Retention: longRetention})
		switch {
		case err == nil:
			r := get(t, s, scope, "late")
			if r.State != idem.StateCompleted || string(r.Result) != "late" {
				t.Errorf("contract: an accepted late Complete must store the result, got state %s result %q", r.State, r.Result)
			}
		case errors.Is(err, idem.ErrLeaseLost):
			t.Log("the store refuses Complete after the lease expired without a takeover (allowed)")
		default:
			t.Errorf("contract: Complete after the lease expired may succeed or fail with ErrLeaseLost, got %v", err)
		}
	}
}

func setupTokensAcrossDeleteAndPurge(t *testing.T, s idem.Store, c config) func(t *testing.T) {
	f := fp("reborn")
	c1 := acquire(t, s, claimReq("reborn", f, longLease))
	if err := s.Delete(context.Background(), scope, "reborn"); err != nil {
		t.Fatalf("contract: Delete removes an in-progress record: %v", err)
	}
	c2 := acquire(t, s, claimReq("reborn", f, longLease))
	if c2.Token <= c1.Token || c2.Takeover {
		t.Errorf("contract: a claim after Delete must get a strictly greater token without Takeover: %d then %d (takeover %v)", c1.Token, c2.Token, c2.Takeover)
	}
	complete(t, s, "reborn", c2.Token, []byte("x"), shortTTL)
	return func(t *testing.T) {
		n, err := s.Purge(context.Background(), 0)
		if err != nil {
			t.Fatalf("Purge: %v", err)
		}
		c.wantPurged(t, n, 1, "Purge after the retention passed")
		c3 := acquire(t, s, claimReq("reborn", f, longLease))
		if c3.Token <= c2.Token || c3.Takeover {
			t.Errorf("contract: a claim after Purge must get a strictly greater token without Takeover: %d then %d (takeover %v)", c2.Token, c3.Token, c3.Takeover)
		}
	}
}

func setupRetentionExpiry(t *testing.T, s idem.Store, _ config) func(t *testing.T) {
	c1 := acquire(t, s, claimReq("window", fp("window"), longLease))
	complete(t, s, "window", c1.Token, []byte("old"), shortTTL)
	c2 := acquire(t, s, claimReq("window-other", fp("window"), longLease))
	complete(t, s, "window-other", c2.Token, []byte("old"), shortTTL)
	wantOutcome(t, claim(t, s, claimReq("window", fp("window"), longLease)), idem.Completed, "a claim inside the retention window replays")
	return func(t *testing.T) {
		c3 := acquire(t, s, claimReq("window", fp("window"), longLease))
		if c3.Takeover || c3.Token <= c1.Token {
			t.Errorf("contract: a completed record past its retention counts as absent: want a fresh claim with a greater token, got token %d (was %d), takeover %v", c3.Token, c1.Token, c3.Takeover)
		}
		// An expired record's fingerprint no longer binds the key either.
		acquire(t, s, claimReq("window-other", fp("a different payload"), longLease))
	}
}

func setupPurge(t *testing.T, s idem.Store, c config) func(t *testing.T) {
	const expired, kept, live = 5, 3, 3
	for i := range expired {
		key := fmt.Sprintf("purge-expired-%d", i)
		cl := acquire(t, s, claimReq(key, fp(key), longLease))
		complete(t, s, key, cl.Token, []byte("gone"), shortTTL)
	}
	for i := range kept {
		key := fmt.Sprintf("purge-kept-%d", i)
		cl := acquire(t, s, claimReq(key, fp(key), longLease))
		complete(t, s, key, cl.Token, []byte("kept"), longRetention)
	}
	for i := range live {
		key := fmt.Sprintf("purge-live-%d", i)
		acquire(t, s, claimReq(key, fp(key), longLease))
	}
	return func(t *testing.T) {
		ctx := context.Background()
		n, err := s.Purge(ctx, 2)
		if err != nil {
			t.Fatalf("Purge: %v", err)
		}
		c.wantPurged(t, n, expired, "Purge(limit 2) works through as many batches as needed")
		for i := range expired {
			_, err := s.Get(ctx, scope, fmt.Sprintf("purge-expired-%d", i))
			wantErr(t, err, idem.ErrNotFound, "Get of a purged record")
		}
		for i := range kept {
			if r := get(t, s, scope, fmt.Sprintf("purge-kept-%d", i)); r.State != idem.StateCompleted || string(r.Result) != "kept" {
				t.Errorf("contract: Purge must keep unexpired completed records, got %+v", r)
			}
		}
		for i := range live {
			if r := get(t, s, scope, fmt.Sprintf("purge-live-%d", i)); r.State != idem.StateInProgress {
				t.Errorf("contract: Purge must keep records in progress, got %+v", r)
			}
		}
		if n, err := s.Purge(ctx, 0); err != nil || n != 0 {
			t.Errorf("contract: a second Purge has nothing left to remove: got %d, %v", n, err)
		}
	}
}
