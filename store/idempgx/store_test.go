package idempgx_test

import (
	"bytes"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idempgx"
)

func fp(s string) idem.Fingerprint { return idem.FingerprintBytes([]byte(s)) }

func TestClaimLifecycle(t *testing.T) {
	t.Parallel()
	s := newStore(t, nil)
	ctx := ctxT(t)
	req := idem.ClaimRequest{Scope: "svc", Key: "k1", Fingerprint: fp("a"), Lease: time.Minute}

	c, err := s.Claim(ctx, req)
	if err != nil || c.Outcome != idem.Acquired || c.Takeover || c.Token <= 0 {
		t.Fatalf("first claim = %+v, %v; want fresh Acquired", c, err)
	}
	if time.Until(c.LeaseExpiresAt) < 50*time.Second {
		t.Fatalf("lease expires at %v, want about a minute from now", c.LeaseExpiresAt)
	}
	c2, err := s.Claim(ctx, req)
	if err != nil || c2.Outcome != idem.InProgress || c2.Record == nil || c2.Record.Token != c.Token {
		t.Fatalf("second claim = %+v, %v; want InProgress with the holder's record", c2, err)
	}
	other := req
	other.Fingerprint = fp("b")
	if c3, err := s.Claim(ctx, other); err != nil || c3.Outcome != idem.Mismatch {
		t.Fatalf("claim with other fingerprint = %+v, %v; want Mismatch", c3, err)
	}

	until, err := s.Extend(ctx, "svc", "k1", c.Token, 2*time.Minute)
	if err != nil || time.Until(until) < 110*time.Second {
		t.Fatalf("extend = %v, %v", until, err)
	}
	if _, err := s.Extend(ctx, "svc", "k1", c.Token+1000, time.Minute); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("extend with wrong token: %v, want ErrLeaseLost", err)
	}
	if err := s.Complete(ctx, idem.CompleteRequest{Scope: "svc", Key: "k1", Token: c.Token + 1000, Result: []byte("x"), Retention: time.Hour}); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("complete with wrong token: %v, want ErrLeaseLost", err)
	}
	if err := s.Complete(ctx, idem.CompleteRequest{Scope: "svc", Key: "k1", Token: c.Token, Result: []byte("done"), Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, idem.CompleteRequest{Scope: "svc", Key: "k1", Token: c.Token, Result: []byte("again"), Retention: time.Hour}); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("second complete: %v, want ErrLeaseLost", err)
	}
	if err := s.Release(ctx, "svc", "k1", c.Token); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("release of completed: %v, want ErrLeaseLost", err)
	}
	c4, err := s.Claim(ctx, req)
	if err != nil || c4.Outcome != idem.Completed || !bytes.Equal(c4.Record.Result, []byte("done")) {
		t.Fatalf("claim after complete = %+v, %v; want Completed with result", c4, err)
	}
	rec, err := s.Get(ctx, "svc", "k1")
	if err != nil || rec.State != idem.StateCompleted || rec.Fingerprint != fp("a") || rec.CompletedAt.IsZero() ||
		!rec.LeaseExpiresAt.IsZero() || time.Until(rec.ExpiresAt) < 59*time.Minute {
		t.Fatalf("get = %+v, %v", rec, err)
	}
	if err := s.Delete(ctx, "svc", "k1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "svc", "k1"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("get after delete: %v, want ErrNotFound", err)
	}
	if err := s.Delete(ctx, "svc", "k1"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("second delete: %v, want ErrNotFound", err)
	}
	c5, err := s.Claim(ctx, req)
	if err != nil || c5.Outcome != idem.Acquired || c5.Token <= c.Token {
		t.Fatalf("claim after delete = %+v, %v; want Acquired with a larger token than %d", c5, err, c.Token)
	}
	if err := s.Release(ctx, "svc", "k1", c5.Token); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, "svc", "k1", c5.Token); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("second release: %v, want ErrLeaseLost", err)
	}
	c6, err := s.Claim(ctx, req)
	if err != nil || c6.Outcome != idem.Acquired || c6.Token <= c5.Token {
		t.Fatalf("claim after release = %+v, %v", c6, err)
	}
}

func TestClaimTakeoverAndExpiry(t *testing.T) {
	t.Parallel()
	s := newStore(t, nil)
	ctx := ctxT(t)
	req := idem.ClaimRequest{Scope: "", Key: "k", Fingerprint: fp("a"), Lease: 20 * time.Millisecond}
	c, err := s.Claim(ctx, req)
	if err != nil || c.Outcome != idem.Acquired {
		t.Fatal(c, err)
	}
	time.Sleep(60 * time.Millisecond)
	mismatch := req
	mismatch.Fingerprint = fp("b")
	if got, err := s.Claim(ctx, mismatch); err != nil || got.Outcome != idem.Mismatch {
		t.Fatalf("claim of expired lease with other content = %+v, %v; want Mismatch", got, err)
	}
	req.Lease = time.Minute
	c2, err := s.Claim(ctx, req)
	if err != nil || c2.Outcome != idem.Acquired || !c2.Takeover || c2.Token <= c.Token {
		t.Fatalf("takeover = %+v, %v", c2, err)
	}
	if err := s.Complete(ctx, idem.CompleteRequest{Key: "k", Token: c.Token, Retention: time.Hour}); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("stale holder complete: %v, want ErrLeaseLost", err)
	}
	if err := s.Complete(ctx, idem.CompleteRequest{Key: "k", Token: c2.Token, Result: []byte("r"), Retention: 20 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(60 * time.Millisecond)
	// The retention passed: the key counts as absent, also for other content.
	c3, err := s.Claim(ctx, mismatch)
	if err != nil || c3.Outcome != idem.Acquired || c3.Takeover || c3.Token <= c2.Token {
		t.Fatalf("claim after retention = %+v, %v; want fresh Acquired", c3, err)
	}
}

func TestExpiredLeaseMayStillComplete(t *testing.T) {
	t.Parallel()
	s := newStore(t, nil)
	ctx := ctxT(t)
	c, err := s.Claim(ctx, idem.ClaimRequest{Key: "k", Lease: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	if err := s.Complete(ctx, idem.CompleteRequest{Key: "k", Token: c.Token, Result: []byte("late"), Retention: time.Hour}); err != nil {
		t.Fatalf("complete of an expired lease nobody took over: %v", err)
	}
}

func TestTombstone(t *testing.T) {
	t.Parallel()
	s := newStore(t, &idempgx.Config{MaxResultBytes: 8})
	ctx := ctxT(t)
	c, err := s.Claim(ctx, idem.ClaimRequest{Key: "big", Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, idem.CompleteRequest{Key: "big", Token: c.Token, Result: []byte("123456789"), Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	rec, err := s.Get(ctx, "", "big")
	if err != nil || !rec.Tombstone || rec.Result != nil || rec.State != idem.StateCompleted {
		t.Fatalf("get = %+v, %v; want a completed tombstone", rec, err)
	}
	c, _ = s.Claim(ctx, idem.ClaimRequest{Key: "fits", Lease: time.Minute})
	if err := s.Complete(ctx, idem.CompleteRequest{Key: "fits", Token: c.Token, Result: []byte("12345678"), Failed: true, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	rec, err = s.Get(ctx, "", "fits")
	if err != nil || rec.Tombstone || string(rec.Result) != "12345678" || !rec.Failed {
		t.Fatalf("get = %+v, %v", rec, err)
	}
}

func TestInvalidInputTouchesNothing(t *testing.T) {
	t.Parallel()
	// A store over an unmigrated schema: any query would fail differently.
	s, err := idempgx.New(testPool(t), &idempgx.Config{Schema: "idem_does_not_exist"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	if _, err := s.Claim(ctx, idem.ClaimRequest{Key: "", Lease: time.Second}); !errors.Is(err, idem.ErrInvalidKey) {
		t.Fatalf("claim with empty key: %v", err)
	}
	if _, err := s.Claim(ctx, idem.ClaimRequest{Key: "k"}); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("claim without lease: %v", err)
	}
	if err := s.Complete(ctx, idem.CompleteRequest{Key: "k\n", Retention: time.Hour}); !errors.Is(err, idem.ErrInvalidKey) {
		t.Fatalf("complete with bad key: %v", err)
	}
	if err := s.Complete(ctx, idem.CompleteRequest{Key: "k"}); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("complete without retention: %v", err)
	}
	if err := s.Release(ctx, "\xff", "k", 1); !errors.Is(err, idem.ErrInvalidScope) {
		t.Fatalf("release with bad scope: %v", err)
	}
	if _, err := s.Extend(ctx, "", "k", 1, 0); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("extend without lease: %v", err)
	}
	if _, err := s.Get(ctx, "", ""); !errors.Is(err, idem.ErrInvalidKey) {
		t.Fatalf("get: %v", err)
	}
	if err := s.Delete(ctx, "", ""); !errors.Is(err, idem.ErrInvalidKey) {
		t.Fatalf("delete: %v", err)
	}
	if _, err := s.Purge(ctx, -1); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("purge: %v", err)
	}
	// A valid call reaches the database and reports the missing schema.
	if _, err := s.Get(ctx, "", "k"); !errors.Is(err, idempgx.ErrNotMigrated) {
		t.Fatalf("get on unmigrated schema: %v, want ErrNotMigrated", err)
	}
}

func TestNewConfig(t *testing.T) {
	t.Parallel()
	if _, err := idempgx.New(nil, nil); err == nil {
		t.Fatal("New(nil) succeeded")
	}
	p := testPool(t)
	for _, cfg := range []*idempgx.Config{{MaxResultBytes: -1}, {PurgeBatch: -1}} {
		if _, err := idempgx.New(p, cfg); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Fatalf("New(%+v): %v, want ErrInvalidConfig", cfg, err)
		}
	}
	s, err := idempgx.New(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := s.Config()
	if got.Schema != "public" || got.MaxResultBytes != idem.DefaultMaxResultBytes || got.PurgeBatch != 1000 || got.Logger == nil {
		t.Fatalf("defaults = %+v", got)
	}
	if !idem.IsDurable(s) {
		t.Fatal("store is not durable")
	}
}

func TestClaimConcurrent(t *testing.T) {
	t.Parallel()
	s := newStore(t, nil)
	ctx := ctxT(t)
	const workers = 32
	var acquired, inProgress atomic.Int32
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			c, err := s.Claim(ctx, idem.ClaimRequest{Key: "hot", Fingerprint: fp("x"), Lease: time.Minute})
			if err != nil {
				t.Error(err)
				return
			}
			switch c.Outcome {
			case idem.Acquired:
				acquired.Add(1)
			case idem.InProgress:
				inProgress.Add(1)
			default:
				t.Errorf("unexpected outcome %v", c.Outcome)
			}
		})
	}
	wg.Wait()
	if acquired.Load() != 1 || inProgress.Load() != workers-1 {
		t.Fatalf("acquired %d, in progress %d; want 1 and %d", acquired.Load(), inProgress.Load(), workers-1)
	}
}

func TestPurgeBatches(t *testing.T) {
	t.Parallel()
	s := newStore(t, &idempgx.Config{PurgeBatch: 100})
	ctx := ctxT(t)
	// 250 expired completed rows, one live completed row, one live lease.
	_, err := s.Pool().Exec(ctx, `INSERT INTO `+qualified(s, "idem_records")+` (scope, key, state, fingerprint, completed_at, expires_at)
		SELECT 'p', 'k' || g, 'completed', decode(repeat('00', 32), 'hex'), now(), now() - interval '1 second'
		FROM generate_series(1, 250) g`)
	if err != nil {
		t.Fatal(err)
	}
	live, err := s.Claim(ctx, idem.ClaimRequest{Scope: "p", Key: "live", Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	c, _ := s.Claim(ctx, idem.ClaimRequest{Scope: "p", Key: "kept", Lease: time.Minute})
	if err := s.Complete(ctx, idem.CompleteRequest{Scope: "p", Key: "kept", Token: c.Token, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	n, err := s.Purge(ctx, 0)
	if err != nil || n != 250 {
		t.Fatalf("purge = %d, %v; want 250", n, err)
	}
	if n, err := s.Purge(ctx, 7); err != nil || n != 0 {
		t.Fatalf("second purge = %d, %v; want 0", n, err)
	}
	if _, err := s.Get(ctx, "p", "kept"); err != nil {
		t.Fatalf("live record purged: %v", err)
	}
	// Tokens keep increasing after a purge.
	if err := s.Delete(ctx, "p", "live"); err != nil {
		t.Fatal(err)
	}
	c2, err := s.Claim(ctx, idem.ClaimRequest{Scope: "p", Key: "k1", Lease: time.Minute})
	if err != nil || c2.Outcome != idem.Acquired || c2.Token <= live.Token {
		t.Fatalf("claim after purge = %+v, %v", c2, err)
	}
}
