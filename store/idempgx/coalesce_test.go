package idempgx_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// statementCounter counts the statements a pool runs, by their SQL.
type statementCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.mu.Lock()
	c.n[d.SQL]++
	c.mu.Unlock()
	return ctx
}

func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *statementCounter) take(sql string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.n[sql]
	c.n[sql] = 0
	return n
}

// extendEnv is a store over a pool of its own (traced, and named so that
// its backends can be told from others) and a connection that holds row
// locks.
type extendEnv struct {
	s      *idempgx.Store
	pool   *pgxpool.Pool
	count  *statementCounter
	app    string
	leases map[string]int64 // key → token
}

func newExtendEnv(t testing.TB, keys int, partitioned bool) *extendEnv {
	t.Helper()
	schema := migratedSchema(t)
	if partitioned {
		m, err := idempgx.NewMigrator(testPool(t), &idempgx.MigratorConfig{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Partition(context.Background(), &idempgx.PartitionOptions{Interval: time.Hour}); err != nil {
			t.Fatalf("partition: %v", err)
		}
	}
	cfg, err := pgxpool.ParseConfig(databaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	e := &extendEnv{count: &statementCounter{n: map[string]int{}}, app: "idem_extend_" + randomSuffix(), leases: map[string]int64{}}
	cfg.MaxConns = 8
	cfg.ConnConfig.Tracer = e.count
	cfg.ConnConfig.RuntimeParams["application_name"] = e.app
	if e.pool, err = pgxpool.NewWithConfig(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.pool.Close)
	// A small MaxResultBytes, so that a completion can carry a tombstone.
	if e.s, err = idempgx.New(e.pool, &idempgx.Config{Schema: schema, MaxResultBytes: 64, Partitioned: partitioned}); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	for i := range keys {
		key := fmt.Sprint("k", i)
		cl, err := e.s.Claim(ctx, idem.ClaimRequest{Scope: "s", Key: key, Fingerprint: idem.Fingerprint{1}, Lease: time.Minute})
		if err != nil || cl.Outcome != idem.Acquired {
			t.Fatalf("claim %s: %+v, %v", key, cl, err)
		}
		e.leases[key] = cl.Token
	}
	return e
}

// lock holds the rows of keys in a transaction of its own until the
// returned release.
func (e *extendEnv) lock(t *testing.T, keys ...string) (release func()) {
	t.Helper()
	ctx := ctxT(t)
	tx, err := testPool(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT FROM `+qualified(e.s, "idem_records")+` WHERE scope = 's' AND key = ANY($1) FOR UPDATE`, keys); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() { once.Do(func() { _ = tx.Rollback(context.Background()) }) }
	t.Cleanup(release)
	return release
}

// waitLocked waits until n of the store's statements wait on a row lock.
func (e *extendEnv) waitLocked(t *testing.T, n int) {
	t.Helper()
	eventually(t, 30*time.Second, fmt.Sprintf("%d extends waiting on row locks", n), func() bool {
		var waiting int
		err := testPool(t).QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'`, e.app).Scan(&waiting)
		return err == nil && waiting == n
	})
}

func (e *extendEnv) leaseOf(t *testing.T, key string) time.Time {
	t.Helper()
	var until time.Time
	if err := testPool(t).QueryRow(ctxT(t), `SELECT lease_expires_at FROM `+qualified(e.s, "idem_records")+` WHERE scope = 's' AND key = $1`, key).Scan(&until); err != nil {
		t.Fatalf("lease of %s: %v", key, err)
	}
	return until
}

func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up after %v waiting for %s", within, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestExtendsShareStatements: heartbeats that arrive while others are in
// flight go out as one statement, and each gets its own answer: its lease's
// new expiry, or ErrLeaseLost for a stale token or a completed record,
// while the others in the same statement are extended.
func TestExtendsShareStatements(t *testing.T) {
	t.Parallel()
	forLayouts(t, func(t *testing.T, partitioned bool) {
		const keys = 120
		e := newExtendEnv(t, keys, partitioned)
		ctx := ctxT(t)
		if err := e.s.Complete(ctx, idem.CompleteRequest{Scope: "s", Key: "k3", Token: e.leases["k3"], Retention: time.Hour}); err != nil {
			t.Fatal(err)
		}
		// The first two Extends go out alone and wait on row locks; the others
		// queue behind them.
		release := e.lock(t, "k0", "k1")
		type call struct {
			key   string
			token int64
			until time.Time
			err   error
		}
		calls := []*call{{key: "k0", token: e.leases["k0"]}, {key: "k1", token: e.leases["k1"]}}
		var wg sync.WaitGroup
		extend := func(c *call) {
			wg.Go(func() { c.until, c.err = e.s.Extend(ctx, "s", c.key, c.token, 2*time.Minute) })
		}
		for _, c := range calls {
			extend(c)
		}
		e.waitLocked(t, 2)
		for i := 2; i < keys; i++ {
			key := fmt.Sprint("k", i)
			calls = append(calls, &call{key: key, token: e.leases[key]})
		}
		calls = append(calls,
			&call{key: "k5", token: e.leases["k5"] + 1000}, // a stale token
			&call{key: "k7", token: e.leases["k7"]},        // one holder's heartbeat twice
		)
		for _, c := range calls[2:] {
			extend(c)
		}
		eventually(t, 30*time.Second, "every other extend queued", func() bool { return idempgx.ExtendsQueued(e.s) == len(calls)-2 })
		e.count.take(idempgx.ExtendBatchSQL(e.s))
		release()
		wg.Wait()

		if n := e.count.take(idempgx.ExtendBatchSQL(e.s)); n < 1 || n > 2 {
			t.Errorf("%d queued extends went out in %d statements, want 1 or 2", len(calls)-2, n)
		}
		for i, c := range calls {
			switch {
			case c.key == "k3" || i == len(calls)-2: // completed, stale token
				if !errors.Is(c.err, idem.ErrLeaseLost) {
					t.Errorf("extend %s (token %d): %v, want ErrLeaseLost", c.key, c.token, c.err)
				}
			case c.err != nil:
				t.Errorf("extend %s: %v", c.key, c.err)
			default:
				if got := e.leaseOf(t, c.key); !got.Equal(c.until) {
					t.Errorf("extend %s returned %v; the record's lease is %v", c.key, c.until, got)
				}
				if left := time.Until(c.until); left < 90*time.Second {
					t.Errorf("extend %s: lease ends in %v, want about 2m", c.key, left)
				}
			}
		}
		if rec, err := e.s.Get(ctx, "s", "k3"); err != nil || rec.State != idem.StateCompleted {
			t.Errorf("k3 after an extend of its completed record: %+v, %v", rec, err)
		}
	})
}

// TestExtendGroupEndsWithItsCallers: a shared heartbeat statement does not
// end with its first caller, but it ends with the last: a server that stops
// answering (here, rows locked by another transaction) cannot hold it, and
// its connection, after every caller has given up, and what it did not
// finish is rolled back.
func TestExtendGroupEndsWithItsCallers(t *testing.T) {
	t.Parallel()
	const keys = 10
	e := newExtendEnv(t, keys, false)
	all := make([]string, keys)
	for i := range all {
		all[i] = fmt.Sprint("k", i)
	}
	release := e.lock(t, all...)
	errs := make([]error, keys)
	var wg sync.WaitGroup
	extend := func(i int) {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_, errs[i] = e.s.Extend(ctx, "s", all[i], e.leases[all[i]], 5*time.Minute)
		})
	}
	extend(0)
	extend(1)
	e.waitLocked(t, 2)
	for i := 2; i < keys; i++ {
		extend(i)
	}
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("extend %s: %v, want the caller's deadline", all[i], err)
		}
	}
	// The rows are still locked, yet every connection comes back.
	eventually(t, 30*time.Second, "the pool's connections released", func() bool { return e.pool.Stat().AcquiredConns() == 0 })
	release()
	for _, key := range all {
		if left := time.Until(e.leaseOf(t, key)); left > 90*time.Second {
			t.Errorf("%s: lease ends in %v, extended by a statement whose callers all gave up", key, left)
		}
	}
	if until, err := e.s.Extend(ctxT(t), "s", "k0", e.leases["k0"], 5*time.Minute); err != nil || time.Until(until) < 4*time.Minute {
		t.Errorf("extend after the locks went: %v, %v", until, err)
	}
}

// TestCompletesShareStatements: completions that arrive while others are in
// flight go out as one statement, each with its own result and its own
// answer: ErrLeaseLost for a stale token, and for the second of two
// completions of one lease, as one after the other; a result over
// MaxResultBytes still becomes a tombstone, and a failure stays a failure.
func TestCompletesShareStatements(t *testing.T) {
	t.Parallel()
	forLayouts(t, func(t *testing.T, partitioned bool) {
		const keys = 100
		e := newExtendEnv(t, keys, partitioned)
		ctx := ctxT(t)
		release := e.lock(t, "k0", "k1")
		type call struct {
			req idem.CompleteRequest
			err error
		}
		complete := func(key string, token int64, result string, failed bool) *call {
			return &call{req: idem.CompleteRequest{Scope: "s", Key: key, Token: token, Result: []byte(result), Failed: failed, Retention: time.Hour}}
		}
		calls := []*call{complete("k0", e.leases["k0"], "r-k0", false), complete("k1", e.leases["k1"], "r-k1", false)}
		var wg sync.WaitGroup
		run := func(c *call) { wg.Go(func() { c.err = e.s.Complete(ctx, c.req) }) }
		for _, c := range calls {
			run(c)
		}
		e.waitLocked(t, 2)
		for i := 2; i < keys; i++ {
			key := fmt.Sprint("k", i)
			calls = append(calls, complete(key, e.leases[key], "r-"+key, i == 4))
		}
		calls[6].req.Result = []byte(strings.Repeat("x", 65)) // over MaxResultBytes
		calls = append(calls,
			complete("k5", e.leases["k5"]+1000, "stale", false), // a stale token
			complete("k7", e.leases["k7"], "r-k7-again", false), // the same lease twice
		)
		for _, c := range calls[2:] {
			run(c)
		}
		eventually(t, 30*time.Second, "every other completion queued", func() bool { return idempgx.CompletesQueued(e.s) == len(calls)-2 })
		e.count.take(idempgx.CompleteBatchSQL(e.s))
		release()
		wg.Wait()

		if n := e.count.take(idempgx.CompleteBatchSQL(e.s)); n < 1 || n > 2 {
			t.Errorf("%d queued completions went out in %d statements, want 1 or 2", len(calls)-2, n)
		}
		twice := 0
		for _, c := range calls {
			key := c.req.Key
			switch {
			case key == "k7":
				if c.err == nil {
					twice++
				} else if !errors.Is(c.err, idem.ErrLeaseLost) {
					t.Errorf("complete k7: %v, want ErrLeaseLost for one of its two completions", c.err)
				}
			case string(c.req.Result) == "stale":
				if !errors.Is(c.err, idem.ErrLeaseLost) {
					t.Errorf("complete %s with a stale token: %v, want ErrLeaseLost", key, c.err)
				}
			case c.err != nil:
				t.Errorf("complete %s: %v", key, c.err)
			}
		}
		if twice != 1 {
			t.Errorf("%d of the two completions of k7 succeeded, want 1", twice)
		}
		for i := range keys {
			key := fmt.Sprint("k", i)
			rec, err := e.s.Get(ctx, "s", key)
			if err != nil || rec.State != idem.StateCompleted || rec.Token != e.leases[key] {
				t.Errorf("%s: %+v, %v", key, rec, err)
				continue
			}
			switch {
			case i == 6:
				if !rec.Tombstone || rec.Result != nil {
					t.Errorf("k6: tombstone %v, result %q; want a tombstone", rec.Tombstone, rec.Result)
				}
			case i == 7:
				if r := string(rec.Result); r != "r-k7" && r != "r-k7-again" {
					t.Errorf("k7: result %q", r)
				}
			default:
				if string(rec.Result) != "r-"+key || rec.Failed != (i == 4) || rec.Tombstone {
					t.Errorf("%s: result %q, failed %v, tombstone %v", key, rec.Result, rec.Failed, rec.Tombstone)
				}
			}
			if left := time.Until(rec.ExpiresAt); left < 50*time.Minute || left > time.Hour+time.Minute {
				t.Errorf("%s: retention ends in %v, want an hour", key, left)
			}
		}
	})
}

// forLayouts runs test on the plain and the partitioned layout, in
// parallel.
func forLayouts(t *testing.T, test func(t *testing.T, partitioned bool)) {
	for _, partitioned := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "partitioned"}[partitioned], func(t *testing.T) {
			t.Parallel()
			test(t, partitioned)
		})
	}
}
