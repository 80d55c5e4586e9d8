package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

const (
	// scope is the scope most subtests use; stores are isolated per subtest,
	// so it need not be unique.
	scope = "storetest"
	// longLease and longRetention are long enough never to pass during a run.
	longLease     = time.Minute
	longRetention = time.Hour
	// shortTTL is the lease or retention the expiry subtests wait out, and
	// expiryWait how long they wait: long enough for any store's clock
	// precision, short enough to keep the suite fast. The subtests that
	// wait run in parallel, so the suite pays for one wait, not one each.
	shortTTL   = time.Second
	expiryWait = 1200 * time.Millisecond
	// clockSkew bounds how far the store's clock may be from the test's.
	clockSkew = 5 * time.Second
)

// config is Options with defaults applied.
type config struct {
	maxResult int
	precision time.Duration
	ttl       bool
}

func newConfig(opts *Options) config {
	c := config{maxResult: idem.DefaultMaxResultBytes, precision: time.Millisecond}
	if opts != nil {
		if opts.MaxResultBytes > 0 {
			c.maxResult = opts.MaxResultBytes
		}
		c.ttl = opts.ExpiresByTTL
		if opts.ClockPrecision > 0 {
			c.precision = opts.ClockPrecision
		}
	}
	return c
}

// wantPurged fails unless Purge removed want records, or, for a store
// whose backend expires records by itself, at most want.
func (c config) wantPurged(t *testing.T, got int64, want int, contract string) {
	t.Helper()
	if got == int64(want) || c.ttl && got >= 0 && got <= int64(want) {
		return
	}
	if c.ttl {
		t.Errorf("contract: %s: Purge must remove at most the %d expired records the backend has not expired itself, removed %d", contract, want, got)
		return
	}
	t.Errorf("contract: %s: Purge must remove exactly the %d expired records, removed %d", contract, want, got)
}

// fp returns a distinct fingerprint per label.
func fp(label string) idem.Fingerprint { return idem.FingerprintBytes([]byte(label)) }

func claimReq(key string, f idem.Fingerprint, lease time.Duration) idem.ClaimRequest {
	return idem.ClaimRequest{Scope: scope, Key: key, Fingerprint: f, Lease: lease}
}

// claim runs Claim and fails the test on an error.
func claim(t *testing.T, s idem.Store, req idem.ClaimRequest) idem.Claim {
	t.Helper()
	c, err := s.Claim(context.Background(), req)
	if err != nil {
		t.Fatalf("Claim(scope %q, key %q): unexpected error: %v", req.Scope, req.Key, err)
	}
	return c
}

// acquire claims a key that must be free and returns the claim.
func acquire(t *testing.T, s idem.Store, req idem.ClaimRequest) idem.Claim {
	t.Helper()
	c := claim(t, s, req)
	if c.Outcome != idem.Acquired {
		t.Fatalf("contract: Claim of a free key (scope %q, key %q) must be Acquired, got %v", req.Scope, req.Key, c.Outcome)
	}
	if c.Token <= 0 {
		t.Fatalf("contract: an Acquired claim must carry a positive fencing token, got %d", c.Token)
	}
	return c
}

// wantOutcome fails unless c.Outcome is want.
func wantOutcome(t *testing.T, c idem.Claim, want idem.Outcome, contract string) {
	t.Helper()
	if c.Outcome != want {
		t.Fatalf("contract: %s: want outcome %v, got %v (record %+v)", contract, want, c.Outcome, c.Record)
	}
}

// complete stores result with retention and fails the test on an error.
func complete(t *testing.T, s idem.Store, key string, token int64, result []byte, retention time.Duration) {
	t.Helper()
	err := s.Complete(context.Background(), idem.CompleteRequest{
		Scope: scope, Key: key, Token: token, Result: result, Retention: retention,
	})
	if err != nil {
		t.Fatalf("Complete(key %q, token %d) by the current holder: unexpected error: %v", key, token, err)
	}
}

// wantErr fails unless errors.Is(err, target).
func wantErr(t *testing.T, err, target error, contract string) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Errorf("contract: %s: want an error wrapping %q, got %v", contract, target, err)
	}
}

// get runs Get and fails the test on an error.
func get(t *testing.T, s idem.Store, sc, key string) idem.Record {
	t.Helper()
	r, err := s.Get(context.Background(), sc, key)
	if err != nil {
		t.Fatalf("Get(scope %q, key %q): unexpected error: %v", sc, key, err)
	}
	return r
}

// near fails unless got is within tol of want.
func near(t *testing.T, got, want time.Time, tol time.Duration, what string) {
	t.Helper()
	if d := got.Sub(want); d < -tol || d > tol {
		t.Errorf("contract: %s: got %v, want %v ± %v (off by %v)", what, got, want, tol, d)
	}
}

// start returns a channel that releases goroutines together, so that a
// race really races.
func start() (chan struct{}, func()) {
	ch := make(chan struct{})
	return ch, func() { close(ch) }
}
