package idempgx_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ownPool is a pool of maxConns connections for one test, closed at
// cleanup. Its connections carry an application_name of their own, which
// lockWaiters looks for.
func ownPool(tb testing.TB, maxConns int32) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(databaseURL(tb))
	if err != nil {
		tb.Fatal(err)
	}
	cfg.MaxConns = maxConns
	cfg.ConnConfig.RuntimeParams["application_name"] = "idemtest_" + randomSuffix()
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Close)
	return p
}

// rowLocker holds row locks on idem records from a connection outside the
// store's pool, so that claims of those keys wait on the lock.
type rowLocker struct{ tx pgx.Tx }

// lockRows locks the records of keys in scope (FOR UPDATE) until the
// returned locker's unlock, or the test's end.
func lockRows(t *testing.T, s *idempgx.Store, scope string, keys ...string) *rowLocker {
	t.Helper()
	ctx := ctxT(t)
	tx, err := testPool(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l := &rowLocker{tx: tx}
	t.Cleanup(l.unlock)
	var n int
	if err := tx.QueryRow(ctx, "SELECT count(*) FROM (SELECT 1 FROM "+qualified(s, "idem_records")+
		" WHERE scope = $1 AND key = ANY($2) FOR UPDATE) AS locked", scope, keys).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != len(keys) {
		t.Fatalf("locked %d rows, want %d", n, len(keys))
	}
	return l
}

func (l *rowLocker) unlock() { _ = l.tx.Rollback(context.Background()) }

// lockWaiters counts the connections of p (made by ownPool) that wait on
// a lock.
func lockWaiters(t *testing.T, p *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := testPool(t).QueryRow(ctxT(t), "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'",
		p.Config().ConnConfig.RuntimeParams["application_name"]).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitUntil polls cond until it holds, failing the test after a minute
// with what describe says.
func waitUntil(t *testing.T, describe func() string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting: %s", describe())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func acquire(t *testing.T, s *idempgx.Store, scope, key string) idem.Claim {
	t.Helper()
	c, err := s.Claim(ctxT(t), idem.ClaimRequest{Scope: scope, Key: key, Fingerprint: fp(key), Lease: time.Hour})
	if err != nil || c.Outcome != idem.Acquired {
		t.Fatalf("claim %q = %+v, %v; want Acquired", key, c, err)
	}
	return c
}

// TestHolderNotQueuedBehindBlockedClaims fills every connection a pool of
// four lets claims have with claims that wait on row locks, queues more
// claims behind them, and then has a lease holder extend, complete and
// release other keys: it must get a connection while the claims still
// wait. Without the reserve the fourth connection goes to a claim too and
// the holder waits until the locks are let go, which here is never: the
// test lets them go only after the holder's calls returned.
func TestHolderNotQueuedBehindBlockedClaims(t *testing.T) {
	t.Parallel()
	const maxConns, claims = 4, 12
	p := ownPool(t, maxConns)
	s, err := idempgx.New(p, &idempgx.Config{Schema: migratedSchema(t)})
	if err != nil {
		t.Fatal(err)
	}
	st := s.ConnStats()
	if st.MaxConns != maxConns || st.HolderConns != 1 || st.GatedConns != maxConns-1 {
		t.Fatalf("stats = %+v; want 1 of 4 connections kept for holders", st)
	}
	gated := st.GatedConns
	ctx := ctxT(t)
	held, released := acquire(t, s, "hold", "held"), acquire(t, s, "hold", "released")
	busy := make([]string, claims)
	for i := range busy {
		busy[i] = fmt.Sprint("busy-", i)
		acquire(t, s, "hold", busy[i])
	}

	type result struct {
		c   idem.Claim
		err error
	}
	results := make(chan result, claims)
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait) // runs after the locker's cleanup lets the claims go
	locker := lockRows(t, s, "hold", busy...)
	for _, k := range busy {
		wg.Go(func() {
			c, err := s.Claim(ctx, idem.ClaimRequest{Scope: "hold", Key: k, Fingerprint: fp(k), Lease: time.Hour})
			results <- result{c, err}
		})
	}
	// Every connection open to claims waits on a lock and the other claims
	// wait for one; or, without a reserve, the whole pool waits on locks.
	waitUntil(t, func() string {
		return fmt.Sprintf("%d claims wait on a lock; stats %+v", lockWaiters(t, p), s.ConnStats())
	}, func() bool {
		n := lockWaiters(t, p)
		return n == maxConns || n == gated && s.ConnStats().GatedWaiting == int64(claims-gated)
	})

	// Generous: the holder needs a connection and three short statements.
	hctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := s.Extend(hctx, "hold", "held", held.Token, time.Hour); err != nil {
		t.Fatalf("Extend while claims fill their connections: %v after %v; the heartbeat queued behind the claims", err, time.Since(start))
	}
	if err := s.Complete(hctx, idem.CompleteRequest{Scope: "hold", Key: "held", Token: held.Token, Result: []byte("ok"), Retention: time.Hour}); err != nil {
		t.Fatalf("Complete while claims fill their connections: %v after %v", err, time.Since(start))
	}
	if err := s.Release(hctx, "hold", "released", released.Token); err != nil {
		t.Fatalf("Release while claims fill their connections: %v after %v", err, time.Since(start))
	}
	took := time.Since(start)
	if n := lockWaiters(t, p); n != gated || len(results) != 0 {
		t.Fatalf("after the holder's calls %d claims wait on a lock and %d returned; want %d and 0", n, len(results), gated)
	}
	t.Logf("Extend, Complete and Release took %v while %d claims waited on row locks and %d for a connection", took, gated, claims-gated)

	locker.unlock()
	for range claims {
		r := <-results
		if r.err != nil || r.c.Outcome != idem.InProgress {
			t.Errorf("claim of a held key = %+v, %v; want InProgress", r.c, r.err)
		}
	}
	if st := s.ConnStats(); st.GatedWaiting != 0 || st.GatedWaits < int64(claims-gated) || st.HolderAcquires != 3 {
		t.Errorf("stats after the storm = %+v", st)
	}
	rec, err := s.Get(ctx, "hold", "held")
	if err != nil || rec.State != idem.StateCompleted || string(rec.Result) != "ok" {
		t.Errorf("held record = %+v, %v", rec, err)
	}
}

// TestGateWaitEndsWithContext: a call waiting for a connection open to
// claims returns as soon as its context ends, with the context's cause
// and a message that says what it waited for; the slot it did not get
// stays usable.
func TestGateWaitEndsWithContext(t *testing.T) {
	t.Parallel()
	p := ownPool(t, 2)
	s, err := idempgx.New(p, &idempgx.Config{Schema: migratedSchema(t)})
	if err != nil {
		t.Fatal(err)
	}
	if st := s.ConnStats(); st.HolderConns != 1 || st.GatedConns != 1 {
		t.Fatalf("stats = %+v; want one connection for claims, one for holders", st)
	}
	ctx := ctxT(t)
	held := acquire(t, s, "ctx", "held")
	acquire(t, s, "ctx", "busy")
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait) // runs after the locker's cleanup lets the claim go
	locker := lockRows(t, s, "ctx", "busy")
	blocked := make(chan error, 1)
	wg.Go(func() {
		_, err := s.Claim(ctx, idem.ClaimRequest{Scope: "ctx", Key: "busy", Fingerprint: fp("busy"), Lease: time.Hour})
		blocked <- err
	})
	waitUntil(t, func() string { return "the claim never waited on the lock" }, func() bool { return lockWaiters(t, p) == 1 })

	shutdown := errors.New("shutting down")
	gctx, cancel := context.WithCancelCause(ctx)
	got := make(chan error, 1)
	wg.Go(func() {
		_, err := s.Get(gctx, "ctx", "held")
		got <- err
	})
	waitUntil(t, func() string { return fmt.Sprintf("Get never waited: %+v", s.ConnStats()) },
		func() bool { return s.ConnStats().GatedWaiting == 1 })
	cancel(shutdown)
	select {
	case err := <-got:
		if !errors.Is(err, shutdown) || idem.IsRetryable(err) ||
			!strings.Contains(err.Error(), "idempgx: get: gave up waiting for one of the 1 pool connections open to claims (1 of 2 are kept for lease holders)") {
			t.Errorf("Get cancelled while waiting = %v; want the cause, not retryable, and what it waited for", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Get did not return after its context was cancelled")
	}

	// A deadline is retryable, like a pool acquire that timed out.
	dctx, dcancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer dcancel()
	if _, err := s.Claim(dctx, idem.ClaimRequest{Scope: "ctx", Key: "other", Lease: time.Hour}); !errors.Is(err, context.DeadlineExceeded) || !idem.IsRetryable(err) {
		t.Errorf("Claim past its deadline while waiting = %v; want retryable DeadlineExceeded", err)
	}

	// The holder still gets the other connection.
	if _, err := s.Extend(ctx, "ctx", "held", held.Token, time.Hour); err != nil {
		t.Errorf("Extend beside a waiting claim: %v", err)
	}
	if st := s.ConnStats(); st.GatedWaiting != 0 || st.GatedWaits != 2 {
		t.Errorf("stats = %+v; want nobody waiting and two waits", st)
	}
	locker.unlock()
	if err := <-blocked; err != nil {
		t.Errorf("blocked claim: %v", err)
	}
	// The slots are all back: claims run again.
	if c, err := s.Claim(ctx, idem.ClaimRequest{Scope: "ctx", Key: "after", Lease: time.Hour}); err != nil || c.Outcome != idem.Acquired {
		t.Errorf("claim after the waits = %+v, %v", c, err)
	}
}

// TestHolderConnsConfig checks the reserve's defaults and the
// configurations New refuses. None of it connects.
func TestHolderConnsConfig(t *testing.T) {
	t.Parallel()
	poolOf := func(t *testing.T, maxConns int32) *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig("postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = maxConns
		p, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return p
	}
	for _, tc := range []struct {
		maxConns              int32
		holderConns           int
		wantHolders, wantOpen int
		wantErr               string
	}{
		{maxConns: 2, wantHolders: 1, wantOpen: 1},
		{maxConns: 4, wantHolders: 1, wantOpen: 3},
		{maxConns: 7, wantHolders: 1, wantOpen: 6},
		{maxConns: 8, wantHolders: 2, wantOpen: 6},
		{maxConns: 40, wantHolders: 10, wantOpen: 30},
		{maxConns: 4, holderConns: 3, wantHolders: 3, wantOpen: 1},
		{maxConns: 40, holderConns: 1, wantHolders: 1, wantOpen: 39},
		{maxConns: 4, holderConns: -1, wantErr: "HolderConns must not be negative, got -1"},
		{maxConns: 4, holderConns: 4, wantErr: "HolderConns 4 leaves none of the pool's 4 connections (MaxConns) to claims; want at most 3"},
		{maxConns: 4, holderConns: 9, wantErr: "HolderConns 9 leaves none"},
		{maxConns: 1, holderConns: 1, wantErr: "HolderConns 1 leaves none of the pool's 1 connections"},
	} {
		t.Run(fmt.Sprintf("%d/%d", tc.maxConns, tc.holderConns), func(t *testing.T) {
			s, err := idempgx.New(poolOf(t, tc.maxConns), &idempgx.Config{HolderConns: tc.holderConns})
			if tc.wantErr != "" {
				if !errors.Is(err, idem.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("New = %v; want ErrInvalidConfig saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			st := s.ConnStats()
			if s.Config().HolderConns != tc.wantHolders || st.HolderConns != tc.wantHolders || st.GatedConns != tc.wantOpen ||
				st.MaxConns != int(tc.maxConns) {
				t.Fatalf("Config().HolderConns = %d, stats %+v; want %d kept, %d open to claims",
					s.Config().HolderConns, st, tc.wantHolders, tc.wantOpen)
			}
		})
	}

	// A pool of one connection cannot keep one back: New says so once,
	// and the store still works (a claim and a holder share it).
	t.Run("single", func(t *testing.T) {
		var logs bytes.Buffer
		logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		s, err := idempgx.New(poolOf(t, 1), &idempgx.Config{Logger: logger})
		if err != nil {
			t.Fatal(err)
		}
		if st := s.ConnStats(); st.HolderConns != 0 || st.GatedConns != 1 || s.Config().HolderConns != 0 {
			t.Fatalf("stats = %+v; want no reserve and one connection open to claims", st)
		}
		if n := strings.Count(logs.String(), "level=WARN"); n != 1 || !strings.Contains(logs.String(), "none can be kept for lease holders") {
			t.Fatalf("logs = %q; want one warning", logs.String())
		}
	})
}

// TestSingleConnectionPoolServesHolders: with no reserve (a pool of one
// connection) claims and holders share the connection, and a Guard still
// runs to the end under concurrent claims.
func TestSingleConnectionPoolServesHolders(t *testing.T) {
	t.Parallel()
	s, err := idempgx.New(ownPool(t, 1), &idempgx.Config{Schema: migratedSchema(t), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	g := idem.NewGuard(s, &idem.GuardConfig{Lease: 3 * time.Second, Wait: time.Minute, Logger: slog.New(slog.DiscardHandler)})
	var ran atomic.Int64
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			res, err := g.Do(ctx, idem.Call{Scope: "one", Key: fmt.Sprint("k", i%2)}, func(ctx context.Context, run idem.Run) ([]byte, error) {
				ran.Add(1)
				return []byte(run.Key), nil
			})
			if err != nil || string(res.Value) != fmt.Sprint("k", i%2) {
				t.Errorf("Do %d = %+v, %v", i, res, err)
			}
		})
	}
	wg.Wait()
	if ran.Load() != 2 {
		t.Errorf("ran %d times, want once per key (2)", ran.Load())
	}
}

// TestLeaseStormOverSmallPool runs dozens of goroutines over a pool of
// four: Guards on shared keys whose functions outlast a heartbeat, beside
// a storm of claims, reads and purges of the same keys. Every key runs
// once, every caller gets its result, and the gate's slots all come back.
// Meant for -race.
func TestLeaseStormOverSmallPool(t *testing.T) {
	t.Parallel()
	p := ownPool(t, 4)
	s, err := idempgx.New(p, &idempgx.Config{Schema: migratedSchema(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	const (
		keys     = 12
		callers  = 3 // per key
		stormers = 24
		lease    = 3 * time.Second
	)
	// fn outlasts a heartbeat (every lease/3); the lease is long enough
	// that a busy machine's scheduling delays cannot expire it.
	hold := lease/3 + 200*time.Millisecond
	g := idem.NewGuard(s, &idem.GuardConfig{Lease: lease, Wait: time.Minute})
	var (
		runs              [keys]atomic.Int64
		running           atomic.Int64          // keys whose function has started
		started           = make(chan struct{}) // closed when every key runs
		callerWG, stormWG sync.WaitGroup
		stop              = make(chan struct{})
		ops               atomic.Int64
	)
	for i := range stormers {
		stormWG.Go(func() {
			// A storm claim of an absent key would acquire it.
			select {
			case <-started:
			case <-stop:
				return
			}
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				k := fmt.Sprint("k", (i+n)%keys)
				var err error
				switch n % 8 {
				case 7:
					_, err = s.Purge(ctx, 0)
				case 3:
					_, err = s.Get(ctx, "storm", k)
				default:
					var c idem.Claim
					// Another fingerprint: a Mismatch that never acquires.
					c, err = s.Claim(ctx, idem.ClaimRequest{Scope: "storm", Key: k, Fingerprint: fp("storm"), Lease: lease})
					if err == nil && c.Outcome != idem.Mismatch {
						err = fmt.Errorf("a storm claim of %s = %v, want Mismatch", k, c.Outcome)
					}
				}
				if err != nil {
					t.Error(err)
					return
				}
				ops.Add(1)
			}
		})
	}
	for i := range keys * callers {
		callerWG.Go(func() {
			k := i % keys
			key := fmt.Sprint("k", k)
			res, err := g.Do(ctx, idem.Call{Scope: "storm", Key: key}, func(ctx context.Context, run idem.Run) ([]byte, error) {
				if runs[k].Add(1) == 1 && running.Add(1) == keys {
					close(started)
				}
				select {
				case <-time.After(hold):
					return []byte(key), nil
				case <-ctx.Done():
					return nil, context.Cause(ctx)
				}
			})
			if err != nil || string(res.Value) != key {
				t.Errorf("Do %s = %+v, %v", key, res, err)
			}
		})
	}
	callerWG.Wait()
	close(stop)
	stormWG.Wait()
	for k := range runs {
		if n := runs[k].Load(); n != 1 {
			t.Errorf("key k%d ran %d times, want 1", k, n)
		}
	}
	st := s.ConnStats()
	t.Logf("%d storm calls; stats %+v", ops.Load(), st)
	// Holders' statements are counted, not calls: concurrent heartbeats
	// (and completions) share one. Every key heartbeats (fn outlasts
	// lease/3) and completes, and the two never share a statement.
	if st.GatedWaiting != 0 || st.HolderAcquires < 2 {
		t.Errorf("stats = %+v; want nobody waiting, and a heartbeat and a completion statement at least", st)
	}
	// Every slot is back: GatedConns claims hold a connection at once.
	busy := make([]string, st.GatedConns)
	for i := range busy {
		busy[i] = fmt.Sprint("busy-", i)
		acquire(t, s, "after", busy[i])
	}
	var blocked sync.WaitGroup
	t.Cleanup(blocked.Wait) // runs after the locker's cleanup lets the claims go
	locker := lockRows(t, s, "after", busy...)
	for _, k := range busy {
		blocked.Go(func() {
			_, _ = s.Claim(ctx, idem.ClaimRequest{Scope: "after", Key: k, Fingerprint: fp(k), Lease: lease})
		})
	}
	waitUntil(t, func() string { return fmt.Sprintf("%d of %d claims wait on a lock", lockWaiters(t, p), st.GatedConns) },
		func() bool { return lockWaiters(t, p) == st.GatedConns })
	locker.unlock()
}
