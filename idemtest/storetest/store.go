package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// storeTest is one subtest of the Store suite. Each gets its own store.
type storeTest struct {
	name string
	run  func(t *testing.T, s idem.Store, c config)
}

var storeTests = []storeTest{
	{"ClaimRaceSameFingerprint", testClaimRaceSameFingerprint},
	{"ClaimRaceDifferentFingerprints", testClaimRaceDifferentFingerprints},
	{"ClaimFreshKey", testClaimFreshKey},
	{"TokenFencing", testTokenFencing},
	{"MissingKey", testMissingKey},
	{"ReleaseThenClaim", testReleaseThenClaim},
	{"CompletedReplay", testCompletedReplay},
	{"MismatchClaimPath", testMismatchClaimPath},
	{"MismatchReplayPath", testMismatchReplayPath},
	{"Retention", testRetention},
	{"Tombstone", testTombstone},
	{"LiteralKeys", testLiteralKeys},
	{"InvalidKey", testInvalidKey},
	{"InvalidScope", testInvalidScope},
	{"InvalidConfig", testInvalidConfig},
	{"Delete", testDelete},
	{"CanceledContext", testCanceledContext},
}

func runStore(t *testing.T, newStore func(t *testing.T) idem.Store, opts *Options) {
	c := newConfig(opts)
	// The group subtest is not parallel, so t.Run returns only after every
	// parallel child finished.
	t.Run("Store", func(t *testing.T) {
		for _, st := range storeTests {
			t.Run(st.name, func(t *testing.T) {
				t.Parallel()
				st.run(t, newStore(t), c)
			})
		}
		t.Run("Expiry", func(t *testing.T) {
			t.Parallel()
			testExpiry(t, newStore, c)
		})
	})
}

const raceClaimers = 64

// raceClaims runs Claim for each fingerprint in fps at the same moment on
// one key and returns the answers in the same order.
func raceClaims(t *testing.T, s idem.Store, key string, fps []idem.Fingerprint) []idem.Claim {
	t.Helper()
	claims := make([]idem.Claim, len(fps))
	errs := make([]error, len(fps))
	gate, open := start()
	var wg sync.WaitGroup
	for i, f := range fps {
		wg.Go(func() {
			<-gate
			claims[i], errs[i] = s.Claim(context.Background(), claimReq(key, f, longLease))
		})
	}
	open()
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("concurrent Claim %d of %d: unexpected error: %v", i, len(fps), err)
		}
	}
	return claims
}

func testClaimRaceSameFingerprint(t *testing.T, s idem.Store, _ config) {
	f := fp("race")
	fps := make([]idem.Fingerprint, raceClaimers)
	for i := range fps {
		fps[i] = f
	}
	claims := raceClaims(t, s, "race", fps)
	var winner idem.Claim
	acquired := 0
	for _, c := range claims {
		switch c.Outcome {
		case idem.Acquired:
			acquired++
			winner = c
		case idem.InProgress:
			if c.Record == nil || c.Record.Fingerprint != f {
				t.Errorf("contract: InProgress must carry the stored record with its fingerprint, got %+v", c.Record)
			}
		default:
			t.Errorf("contract: %d concurrent claims with one fingerprint may only be Acquired or InProgress, got %v", raceClaimers, c.Outcome)
		}
	}
	if acquired != 1 {
		t.Fatalf("contract: %d concurrent claims of one key must give exactly one Acquired, got %d", raceClaimers, acquired)
	}
	for _, c := range claims {
		if c.Outcome == idem.InProgress && c.Record != nil && c.Record.Token != winner.Token {
			t.Errorf("contract: InProgress must report the winner's token %d, got %d", winner.Token, c.Record.Token)
		}
	}
	if r := get(t, s, scope, "race"); r.Token != winner.Token || r.State != idem.StateInProgress {
		t.Errorf("contract: after the race the record must hold the winner's lease (token %d, in_progress), got token %d, state %s", winner.Token, r.Token, r.State)
	}
}

func testClaimRaceDifferentFingerprints(t *testing.T, s idem.Store, _ config) {
	fps := make([]idem.Fingerprint, raceClaimers)
	for i := range fps {
		fps[i] = fp(fmt.Sprintf("conflict-%d", i%4))
	}
	claims := raceClaims(t, s, "conflict", fps)
	winner := -1
	for i, c := range claims {
		if c.Outcome == idem.Acquired {
			if winner >= 0 {
				t.Fatalf("contract: concurrent claims with different fingerprints must never give two Acquired (claims %d and %d)", winner, i)
			}
			winner = i
		}
	}
	if winner < 0 {
		t.Fatal("contract: one of the concurrent claims on a free key must be Acquired, none was")
	}
	wf := fps[winner]
	for i, c := range claims {
		switch {
		case i == winner:
		case c.Outcome == idem.Mismatch:
			if fps[i] == wf {
				t.Errorf("contract: a claim with the stored fingerprint must not be a Mismatch")
			}
			if c.Record == nil || c.Record.Fingerprint != wf {
				t.Errorf("contract: Mismatch must carry the stored record with the winner's fingerprint, got %+v", c.Record)
			}
		case c.Outcome == idem.InProgress:
		default:
			t.Errorf("contract: a losing concurrent claim must be InProgress or Mismatch, got %v", c.Outcome)
		}
	}
	r := get(t, s, scope, "conflict")
	if r.Fingerprint != wf || r.Token != claims[winner].Token {
		t.Errorf("contract: the conflict path must leave the winner's record untouched (token %d), got token %d and another fingerprint=%v",
			claims[winner].Token, r.Token, r.Fingerprint != wf)
	}
}

func testClaimFreshKey(t *testing.T, s idem.Store, c config) {
	f := fp("fresh")
	before := time.Now()
	cl := acquire(t, s, claimReq("fresh", f, longLease))
	if cl.Takeover {
		t.Error("contract: the first claim of a key is not a Takeover")
	}
	near(t, cl.LeaseExpiresAt, before.Add(longLease), clockSkew, "Claim.LeaseExpiresAt is the store's now + Lease")
	r := get(t, s, scope, "fresh")
	if r.State != idem.StateInProgress || r.Token != cl.Token || r.Fingerprint != f || r.Scope != scope || r.Key != "fresh" {
		t.Errorf("contract: Get after Claim must show the in_progress record with the claim's token, fingerprint, scope and key, got %+v", r)
	}
	near(t, r.LeaseExpiresAt, cl.LeaseExpiresAt, c.precision, "Record.LeaseExpiresAt equals Claim.LeaseExpiresAt")
	near(t, r.CreatedAt, before, clockSkew, "Record.CreatedAt is the store's now at the claim")

	again := claim(t, s, claimReq("fresh", f, longLease))
	wantOutcome(t, again, idem.InProgress, "a second claim while the lease is live")
	if again.Record == nil || again.Record.Token != cl.Token || again.Record.State != idem.StateInProgress {
		t.Errorf("contract: InProgress must carry the holder's record (token %d), got %+v", cl.Token, again.Record)
	}
	if again.Token != 0 {
		t.Errorf("contract: only Acquired hands out a token, InProgress carried %d", again.Token)
	}
}

// wantLeaseLost checks that Complete, Extend and Release all refuse token.
// Release goes last: if the store wrongly accepted it, it would free the key.
func wantLeaseLost(t *testing.T, s idem.Store, key string, token int64, why string) {
	t.Helper()
	ctx := context.Background()
	err := s.Complete(ctx, idem.CompleteRequest{Scope: scope, Key: key, Token: token, Result: []byte("stale"), Retention: longRetention})
	wantErr(t, err, idem.ErrLeaseLost, "Complete "+why)
	_, err = s.Extend(ctx, scope, key, token, longLease)
	wantErr(t, err, idem.ErrLeaseLost, "Extend "+why)
	err = s.Release(ctx, scope, key, token)
	wantErr(t, err, idem.ErrLeaseLost, "Release "+why)
}

func testTokenFencing(t *testing.T, s idem.Store, c config) {
	ctx := context.Background()
	cl := acquire(t, s, claimReq("fenced", fp("fenced"), longLease))
	for _, wrong := range []int64{cl.Token - 1, cl.Token + 1, cl.Token + 1000, 0, -1} {
		wantLeaseLost(t, s, "fenced", wrong, fmt.Sprintf("with wrong token %d (current %d)", wrong, cl.Token))
	}

	before := time.Now()
	exp, err := s.Extend(ctx, scope, "fenced", cl.Token, 2*longLease)
	if err != nil {
		t.Fatalf("contract: Extend with the current token must succeed: %v", err)
	}
	if !exp.After(cl.LeaseExpiresAt) {
		t.Errorf("contract: Extend must return a later expiry than the claim's %v, got %v", cl.LeaseExpiresAt, exp)
	}
	near(t, exp, before.Add(2*longLease), clockSkew, "Extend returns the store's now + lease")
	r := get(t, s, scope, "fenced")
	near(t, r.LeaseExpiresAt, exp, c.precision, "Get after Extend shows the new LeaseExpiresAt")
	if r.Token != cl.Token {
		t.Errorf("contract: Extend must keep the token %d, record has %d", cl.Token, r.Token)
	}

	complete(t, s, "fenced", cl.Token, []byte("done"), longRetention)
	wantLeaseLost(t, s, "fenced", cl.Token, "on a completed record, even with its last token")
	if r := get(t, s, scope, "fenced"); r.State != idem.StateCompleted || string(r.Result) != "done" {
		t.Errorf("contract: a refused Complete/Release must leave the completed record alone, got state %s result %q", r.State, r.Result)
	}
}

func testMissingKey(t *testing.T, s idem.Store, _ config) {
	wantLeaseLost(t, s, "missing", 1, "on a missing key")
	_, err := s.Get(context.Background(), scope, "missing")
	wantErr(t, err, idem.ErrNotFound, "Get of a missing key")
	err = s.Delete(context.Background(), scope, "missing")
	wantErr(t, err, idem.ErrNotFound, "Delete of a missing key")
}

func testReleaseThenClaim(t *testing.T, s idem.Store, _ config) {
	ctx := context.Background()
	f := fp("released")
	c1 := acquire(t, s, claimReq("released", f, longLease))
	if err := s.Release(ctx, scope, "released", c1.Token); err != nil {
		t.Fatalf("contract: Release with the current token must succeed: %v", err)
	}
	_, err := s.Get(ctx, scope, "released")
	wantErr(t, err, idem.ErrNotFound, "a released key is absent for Get")
	c2 := acquire(t, s, claimReq("released", f, longLease))
	if c2.Token <= c1.Token {
		t.Errorf("contract: a claim after Release must get a strictly greater token: %d then %d", c1.Token, c2.Token)
	}
	if c2.Takeover {
		t.Error("contract: a claim after Release is not a Takeover")
	}
	wantLeaseLost(t, s, "released", c1.Token, "with the token released before")
	// A key released with one fingerprint is free for another.
	if err := s.Release(ctx, scope, "released", c2.Token); err != nil {
		t.Fatalf("contract: Release with the current token must succeed: %v", err)
	}
	acquire(t, s, claimReq("released", fp("other payload"), longLease))
}

func testCompletedReplay(t *testing.T, s idem.Store, _ config) {
	binary := make([]byte, 512)
	for i := range binary {
		binary[i] = byte(i)
	}
	cases := []struct {
		key    string
		result []byte
		failed bool
	}{
		{"text", []byte(`{"status":201,"body":"ok"}`), false},
		{"empty", []byte{}, false},
		{"nil", nil, false},
		{"binary", binary, false},
		{"invalid-utf8", []byte{0xff, 0xfe, 0x00, 0xc3, 0x28}, false},
		{"failed", []byte("card declined"), true},
	}
	ctx := context.Background()
	for _, tc := range cases {
		f := fp(tc.key)
		cl := acquire(t, s, claimReq(tc.key, f, longLease))
		err := s.Complete(ctx, idem.CompleteRequest{Scope: scope, Key: tc.key, Token: cl.Token, Result: tc.result, Failed: tc.failed, Retention: longRetention})
		if err != nil {
			t.Fatalf("Complete(%s): %v", tc.key, err)
		}
		r := claim(t, s, claimReq(tc.key, f, longLease))
		wantOutcome(t, r, idem.Completed, "Claim after Complete ("+tc.key+")")
		if r.Record == nil {
			t.Fatalf("contract: Completed must carry the record (%s)", tc.key)
		}
		for _, got := range []idem.Record{*r.Record, get(t, s, scope, tc.key)} {
			if !bytes.Equal(got.Result, tc.result) || got.Failed != tc.failed || got.Tombstone ||
				got.State != idem.StateCompleted || got.Token != cl.Token || got.Fingerprint != f {
				t.Errorf("contract: a completed record replays its exact result (%s): want result %x failed %v token %d, got result %x failed %v tombstone %v state %s token %d",
					tc.key, tc.result, tc.failed, cl.Token, got.Result, got.Failed, got.Tombstone, got.State, got.Token)
			}
		}
	}
}

func testMismatchClaimPath(t *testing.T, s idem.Store, _ config) {
	a := fp("A")
	cl := acquire(t, s, claimReq("mm-claim", a, longLease))
	m := claim(t, s, claimReq("mm-claim", fp("B"), longLease))
	wantOutcome(t, m, idem.Mismatch, "a claim with another fingerprint on an in-progress record")
	if m.Record == nil || m.Record.Fingerprint != a || m.Record.Token != cl.Token {
		t.Errorf("contract: Mismatch must carry the stored record (fingerprint A, token %d), got %+v", cl.Token, m.Record)
	}
	if r := get(t, s, scope, "mm-claim"); r.Fingerprint != a || r.Token != cl.Token || r.State != idem.StateInProgress {
		t.Errorf("contract: a Mismatch must leave the record untouched, got %+v", r)
	}
	complete(t, s, "mm-claim", cl.Token, []byte("a"), longRetention)
}

func testMismatchReplayPath(t *testing.T, s idem.Store, _ config) {
	a := fp("A")
	cl := acquire(t, s, claimReq("mm-replay", a, longLease))
	complete(t, s, "mm-replay", cl.Token, []byte("result of A"), longRetention)
	m := claim(t, s, claimReq("mm-replay", fp("B"), longLease))
	wantOutcome(t, m, idem.Mismatch, "a claim with another fingerprint on a completed record")
	if m.Record == nil || m.Record.Fingerprint != a {
		t.Errorf("contract: Mismatch must carry the stored record with fingerprint A, got %+v", m.Record)
	}
	r := claim(t, s, claimReq("mm-replay", a, longLease))
	wantOutcome(t, r, idem.Completed, "the right fingerprint still replays after a Mismatch")
	if r.Record == nil || string(r.Record.Result) != "result of A" {
		t.Errorf("contract: replay after a Mismatch must return the original result, got %+v", r.Record)
	}
}

func testRetention(t *testing.T, s idem.Store, c config) {
	for _, ret := range []time.Duration{time.Second, time.Minute, 24 * time.Hour, 30 * 24 * time.Hour} {
		key := "retention-" + ret.String()
		before := time.Now()
		cl := acquire(t, s, claimReq(key, fp(key), longLease))
		complete(t, s, key, cl.Token, []byte("r"), ret)
		r := get(t, s, scope, key)
		if got := r.ExpiresAt.Sub(r.CompletedAt); got < ret-c.precision || got > ret+c.precision {
			t.Errorf("contract: retention %v: ExpiresAt - CompletedAt must be the retention, got %v (completed %v, expires %v)", ret, got, r.CompletedAt, r.ExpiresAt)
		}
		near(t, r.CompletedAt, before, clockSkew, "CompletedAt is the store's now at Complete")
		if r.CompletedAt.Before(r.CreatedAt.Add(-c.precision)) {
			t.Errorf("contract: CompletedAt %v must not precede CreatedAt %v", r.CompletedAt, r.CreatedAt)
		}
	}
}

func testTombstone(t *testing.T, s idem.Store, c config) {
	big := bytes.Repeat([]byte{'x'}, c.maxResult+1)
	f := fp("big")
	cl := acquire(t, s, claimReq("big", f, longLease))
	err := s.Complete(context.Background(), idem.CompleteRequest{Scope: scope, Key: "big", Token: cl.Token, Result: big, Retention: longRetention})
	if err != nil {
		t.Fatalf("contract: Complete with a result over the limit must succeed and leave a tombstone, got %v", err)
	}
	r := get(t, s, scope, "big")
	if r.State != idem.StateCompleted || !r.Tombstone || r.Result != nil {
		t.Errorf("contract: a result of MaxResultBytes+1 = %d bytes makes a tombstone (completed, Tombstone, nil Result), got state %s tombstone %v result of %d bytes (nil %v)",
			len(big), r.State, r.Tombstone, len(r.Result), r.Result == nil)
	}
	rc := claim(t, s, claimReq("big", f, longLease))
	wantOutcome(t, rc, idem.Completed, "a claim on a tombstone (the operation must not run again)")
	if rc.Record == nil || !rc.Record.Tombstone {
		t.Errorf("contract: Claim on a tombstone must report Record.Tombstone, got %+v", rc.Record)
	}

	exact := bytes.Repeat([]byte{'y'}, c.maxResult)
	cl = acquire(t, s, claimReq("exact", fp("exact"), longLease))
	complete(t, s, "exact", cl.Token, exact, longRetention)
	if r := get(t, s, scope, "exact"); r.Tombstone || !bytes.Equal(r.Result, exact) {
		t.Errorf("contract: a result of exactly MaxResultBytes = %d is kept, got tombstone %v and %d bytes", len(exact), r.Tombstone, len(r.Result))
	}
}

// literalPairs are (scope, key) pairs that a store building keys or queries
// from strings could confuse with one another or with its own syntax.
var literalPairs = [][2]string{
	{scope, `it's`},
	{scope, `say "hi"`},
	{scope, `a;b`},
	{scope, `a%`},
	{scope, `ab`},
	{scope, `a_c`},
	{scope, `abc`},
	{scope, `a*`},
	{scope, `a:b`},
	{scope, `back\slash`},
	{scope, `back\\slash`},
	{scope, `with space`},
	{scope, ` `},
	{scope, `'; DROP TABLE x; --`},
	{scope, `" OR 1=1 --`},
	{scope, `{hash}tag`},
	{scope, `$1`},
	{"a:b", "c"},
	{"a", "b:c"},
	{"a", "b"},
	{"a|b", "c"},
	{"a", "b|c"},
	{"a%", "x"},
	{"ab", "x"},
	{"a_c", "x"},
	{"abc", "x"},
	{"", "empty-scope"},
	{"ünïcødé/スコープ", "x"},
	{"'; DROP TABLE x; --", "x"},
	{strings.Repeat("s", idem.MaxScopeLen), "x"},
	{scope, strings.Repeat("k", idem.MaxKeyLen)},
	{scope, "~!@#$^&()-+=[]{}<>,./?`"},
}

func testLiteralKeys(t *testing.T, s idem.Store, _ config) {
	ctx := context.Background()
	name := func(p [2]string) string { return fmt.Sprintf("scope %q key %q", p[0], p[1]) }
	for _, p := range literalPairs {
		req := idem.ClaimRequest{Scope: p[0], Key: p[1], Fingerprint: fp(name(p)), Lease: longLease}
		c, err := s.Claim(ctx, req)
		if err != nil {
			t.Fatalf("Claim(%s): %v", name(p), err)
		}
		if c.Outcome != idem.Acquired {
			t.Fatalf("contract: distinct (scope, key) pairs never collide: the first claim of %s got %v (record %+v)", name(p), c.Outcome, c.Record)
		}
		err = s.Complete(ctx, idem.CompleteRequest{Scope: p[0], Key: p[1], Token: c.Token, Result: []byte(name(p)), Retention: longRetention})
		if err != nil {
			t.Fatalf("Complete(%s): %v", name(p), err)
		}
	}
	for _, p := range literalPairs {
		r := get(t, s, p[0], p[1])
		if r.Scope != p[0] || r.Key != p[1] || string(r.Result) != name(p) || r.Fingerprint != fp(name(p)) {
			t.Errorf("contract: keys and scopes are stored literally: Get(%s) returned scope %q key %q result %q", name(p), r.Scope, r.Key, r.Result)
		}
		c, err := s.Claim(ctx, idem.ClaimRequest{Scope: p[0], Key: p[1], Fingerprint: fp(name(p)), Lease: longLease})
		if err != nil || c.Outcome != idem.Completed || c.Record == nil || string(c.Record.Result) != name(p) {
			t.Errorf("contract: replay of %s must return its own result, got %v %+v %v", name(p), c.Outcome, c.Record, err)
		}
	}
}

// everyMethod calls each Store method with (sc, key) and returns the
// method names with their errors.
func everyMethod(s idem.Store, sc, key string) map[string]error {
	ctx := context.Background()
	errs := make(map[string]error)
	_, errs["Claim"] = s.Claim(ctx, idem.ClaimRequest{Scope: sc, Key: key, Lease: longLease})
	errs["Complete"] = s.Complete(ctx, idem.CompleteRequest{Scope: sc, Key: key, Token: 1, Retention: longRetention})
	errs["Release"] = s.Release(ctx, sc, key, 1)
	_, errs["Extend"] = s.Extend(ctx, sc, key, 1, longLease)
	_, errs["Get"] = s.Get(ctx, sc, key)
	errs["Delete"] = s.Delete(ctx, sc, key)
	return errs
}

func testInvalidKey(t *testing.T, s idem.Store, _ config) {
	keys := map[string]string{
		"empty":        "",
		"256 bytes":    strings.Repeat("k", idem.MaxKeyLen+1),
		"non-ASCII":    "clé",
		"control char": "a\x01b",
		"newline":      "a\nb",
		"tab":          "a\tb",
		"NUL":          "a\x00b",
		"DEL":          "a\x7fb",
	}
	for what, key := range keys {
		for method, err := range everyMethod(s, scope, key) {
			wantErr(t, err, idem.ErrInvalidKey, fmt.Sprintf("%s rejects a %s key", method, what))
		}
	}
	// Nothing may have been stored under the valid prefix of a rejected key.
	_, err := s.Get(context.Background(), scope, strings.Repeat("k", idem.MaxKeyLen))
	wantErr(t, err, idem.ErrNotFound, "a rejected key leaves nothing behind")
}

func testInvalidScope(t *testing.T, s idem.Store, _ config) {
	scopes := map[string]string{
		"invalid UTF-8": "bad\xff\xfe",
		"1025 bytes":    strings.Repeat("s", idem.MaxScopeLen+1),
	}
	for what, sc := range scopes {
		for method, err := range everyMethod(s, sc, "key") {
			wantErr(t, err, idem.ErrInvalidScope, fmt.Sprintf("%s rejects a scope that is %s", method, what))
		}
	}
}

func testInvalidConfig(t *testing.T, s idem.Store, _ config) {
	ctx := context.Background()
	for _, d := range []time.Duration{0, -time.Second} {
		_, err := s.Claim(ctx, claimReq("config", fp("config"), d))
		wantErr(t, err, idem.ErrInvalidConfig, fmt.Sprintf("Claim rejects lease %v", d))
	}
	cl := acquire(t, s, claimReq("config", fp("config"), longLease))
	for _, d := range []time.Duration{0, -time.Second} {
		err := s.Complete(ctx, idem.CompleteRequest{Scope: scope, Key: "config", Token: cl.Token, Retention: d})
		wantErr(t, err, idem.ErrInvalidConfig, fmt.Sprintf("Complete rejects retention %v", d))
		_, err = s.Extend(ctx, scope, "config", cl.Token, d)
		wantErr(t, err, idem.ErrInvalidConfig, fmt.Sprintf("Extend rejects lease %v", d))
	}
	if r := get(t, s, scope, "config"); r.State != idem.StateInProgress || r.Token != cl.Token {
		t.Errorf("contract: rejected calls leave the record alone, got %+v", r)
	}
	complete(t, s, "config", cl.Token, nil, longRetention)
}

func testDelete(t *testing.T, s idem.Store, _ config) {
	ctx := context.Background()
	cl := acquire(t, s, claimReq("deleted-live", fp("d"), longLease))
	if err := s.Delete(ctx, scope, "deleted-live"); err != nil {
		t.Fatalf("contract: Delete removes an in-progress record: %v", err)
	}
	wantLeaseLost(t, s, "deleted-live", cl.Token, "by the holder after its record was deleted")
	_, err := s.Get(ctx, scope, "deleted-live")
	wantErr(t, err, idem.ErrNotFound, "Get after Delete")

	cl = acquire(t, s, claimReq("deleted-done", fp("d"), longLease))
	complete(t, s, "deleted-done", cl.Token, []byte("done"), longRetention)
	if err := s.Delete(ctx, scope, "deleted-done"); err != nil {
		t.Fatalf("contract: Delete removes a completed record: %v", err)
	}
	_, err = s.Get(ctx, scope, "deleted-done")
	wantErr(t, err, idem.ErrNotFound, "Get after Delete")
	again := acquire(t, s, claimReq("deleted-done", fp("another payload"), longLease))
	if again.Takeover {
		t.Error("contract: a claim after Delete is not a Takeover")
	}
	err = s.Delete(ctx, scope, "deleted-done-never")
	wantErr(t, err, idem.ErrNotFound, "Delete of a missing key")
}

func testCanceledContext(t *testing.T, s idem.Store, _ config) {
	cl := acquire(t, s, claimReq("canceled", fp("c"), longLease))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	errs := make(map[string]error)
	_, errs["Claim"] = s.Claim(ctx, claimReq("canceled-new", fp("c"), longLease))
	errs["Complete"] = s.Complete(ctx, idem.CompleteRequest{Scope: scope, Key: "canceled", Token: cl.Token, Retention: longRetention})
	_, errs["Extend"] = s.Extend(ctx, scope, "canceled", cl.Token, longLease)
	_, errs["Get"] = s.Get(ctx, scope, "canceled")
	_, errs["Purge"] = s.Purge(ctx, 0)
	errs["Release"] = s.Release(ctx, scope, "canceled", cl.Token)
	errs["Delete"] = s.Delete(ctx, scope, "canceled")
	for method, err := range errs {
		switch {
		case err == nil:
			t.Errorf("contract: %s with a cancelled context must return an error", method)
		case !errors.Is(err, context.Canceled):
			t.Logf("%s with a cancelled context returned %v, which does not wrap context.Canceled (allowed)", method, err)
		}
	}
	if r := get(t, s, scope, "canceled"); r.State != idem.StateInProgress || r.Token != cl.Token {
		t.Errorf("contract: calls with a cancelled context must change nothing, got %+v", r)
	}
}
