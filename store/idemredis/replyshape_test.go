package idemredis_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// When every item of a claim call is fresh, the script answers with the
// token alone and Go derives each lease from it; the records must hold
// exactly what the claims report. The same holds for a call of one key
// (Store.Claim) and for a call whose first items are fresh and a later
// one is not (the script then answers item by item).
func TestFreshClaimsMatchTheirRecords(t *testing.T) {
	t.Parallel()
	_, _, s := privateStore(t)
	ctx := context.Background()
	check := func(key string, c idem.Claim) {
		t.Helper()
		r, err := s.Get(ctx, "batch", key)
		if err != nil {
			t.Fatalf("Get %s: %v", key, err)
		}
		if c.Outcome != idem.Acquired || c.Takeover || r.Token != c.Token || !r.LeaseExpiresAt.Equal(c.LeaseExpiresAt) ||
			r.State != idem.StateInProgress {
			t.Errorf("%s: claim %+v, record %+v", key, c, r)
		}
		// The token is the server's time in µs; the record was created at
		// its whole milliseconds.
		if want := time.UnixMilli(c.Token / 1000); !r.CreatedAt.Equal(want) {
			t.Errorf("%s: created %v, want %v (token %d)", key, r.CreatedAt, want, c.Token)
		}
		if d := r.ExpiresAt.Sub(r.LeaseExpiresAt); d != idem.DefaultRetention {
			t.Errorf("%s: expiry - lease expiry = %v, want the abandoned retention", key, d)
		}
	}
	one, err := s.Claim(ctx, batchReq("one", "a", time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	check("one", one)
	got, err := s.ClaimBatch(ctx, []idem.ClaimRequest{batchReq("f1", "a", time.Minute), batchReq("f2", "a", time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range []string{"f1", "f2"} {
		if got[i].Err != nil {
			t.Fatal(got[i].Err)
		}
		check(k, got[i].Claim)
	}
	if got[0].Token != got[1].Token || got[0].Token <= one.Token {
		t.Errorf("tokens %d, %d after %d: want one token per call, increasing", got[0].Token, got[1].Token, one.Token)
	}
	mixed, err := s.ClaimBatch(ctx, []idem.ClaimRequest{batchReq("m1", "a", time.Minute), batchReq("one", "a", time.Minute),
		batchReq("m2", "a", time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	if mixed[1].Err != nil || mixed[1].Outcome != idem.InProgress {
		t.Errorf("held key in a mixed call: %v, %v", mixed[1].Outcome, mixed[1].Err)
	}
	check("m1", mixed[0].Claim)
	check("m2", mixed[2].Claim)

	// Completions: all done answers 1 alone; a refused one answers item by item.
	errs, err := s.CompleteBatch(ctx, []idem.CompleteRequest{
		{Scope: "batch", Key: "f1", Token: got[0].Token, Result: []byte("r1"), Retention: time.Hour},
		{Scope: "batch", Key: "f2", Token: got[1].Token, Result: []byte("r2"), Retention: time.Hour},
	})
	if err != nil || errs[0] != nil || errs[1] != nil {
		t.Fatalf("CompleteBatch: %v %v", errs, err)
	}
	errs, err = s.CompleteBatch(ctx, []idem.CompleteRequest{
		{Scope: "batch", Key: "m1", Token: mixed[0].Token, Result: []byte("r"), Retention: time.Hour},
		{Scope: "batch", Key: "f1", Token: got[0].Token, Result: []byte("again"), Retention: time.Hour},
		{Scope: "batch", Key: "m2", Token: mixed[2].Token, Result: []byte("r"), Retention: time.Hour},
	})
	if err != nil || errs[0] != nil || !errors.Is(errs[1], idem.ErrLeaseLost) || errs[2] != nil {
		t.Fatalf("CompleteBatch with a completed record in the middle: %v %v", errs, err)
	}
	for _, k := range []string{"f1", "f2", "m1", "m2"} {
		if r, err := s.Get(ctx, "batch", k); err != nil || r.State != idem.StateCompleted {
			t.Errorf("%s: %+v %v, want completed", k, r, err)
		}
	}
	if r, _ := s.Get(ctx, "batch", "f1"); string(r.Result) != "r1" {
		t.Errorf("f1 result %q, want r1 (the second Complete was refused)", r.Result)
	}
}
