package idemmysql_test

import (
	"bytes"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idemmysql"
)

// statementCounter counts the group statements a pool sends, by name (see
// idemmysql.GroupStatement).
type statementCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *statementCounter) add(query string) {
	if name := idemmysql.GroupStatement(query); name != "" {
		c.mu.Lock()
		c.n[name]++
		c.mu.Unlock()
	}
}

// take returns how many statements named name were sent since the last
// take, and starts again from 0.
func (c *statementCounter) take(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.n[name]
	c.n[name] = 0
	return n
}

// countingConnector hands out the driver's connections, counting the
// statements they send: executed with interpolated parameters, or prepared
// (then each execution of the store's is one preparation).
type countingConnector struct {
	driver.Connector
	count *statementCounter
}

func (c countingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: conn, count: c.count}, nil
}

type countingConn struct {
	driver.Conn
	count *statementCounter
}

func (c *countingConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	c.count.add(query)
	return c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, query)
}

func (c *countingConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	r, err := c.Conn.(driver.ExecerContext).ExecContext(ctx, query, args)
	if !errors.Is(err, driver.ErrSkip) {
		c.count.add(query)
	}
	return r, err
}

func (c *countingConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	r, err := c.Conn.(driver.QueryerContext).QueryContext(ctx, query, args)
	if !errors.Is(err, driver.ErrSkip) {
		c.count.add(query)
	}
	return r, err
}

func (c *countingConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	return c.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
}

func (c *countingConn) Ping(ctx context.Context) error { return c.Conn.(driver.Pinger).Ping(ctx) }

func (c *countingConn) ResetSession(ctx context.Context) error {
	return c.Conn.(driver.SessionResetter).ResetSession(ctx)
}

func (c *countingConn) IsValid() bool { return c.Conn.(driver.Validator).IsValid() }

func (c *countingConn) CheckNamedValue(nv *driver.NamedValue) error {
	return c.Conn.(driver.NamedValueChecker).CheckNamedValue(nv)
}

// holderOpts are the options of a holderEnv.
type holderOpts struct {
	prepared    bool // no interpolateParams: the driver prepares every statement
	maxConns    int  // the store's pool; default 8
	holderConns int
	lockWait    int // the store's sessions' innodb_lock_wait_timeout, in seconds; 0: the server's
	maxResult   int // MaxResultBytes; default 64, so that a completion can carry a tombstone
}

// holderEnv is a store over a database and a pool of its own (counting the
// group statements), with keys claimed in scope "s", and another pool that
// holds row locks and looks at the rows.
type holderEnv struct {
	s      *idemmysql.Store
	db     *sql.DB // the store's pool
	other  *sql.DB
	name   string // the database
	count  *statementCounter
	leases map[string]int64 // key → token
}

func newHolderEnv(tb testing.TB, keys int, o holderOpts) *holderEnv {
	tb.Helper()
	other := migratedDB(tb, 8)
	e := &holderEnv{other: other, count: &statementCounter{n: map[string]int{}}, leases: map[string]int64{}}
	if err := other.QueryRow("SELECT DATABASE()").Scan(&e.name); err != nil {
		tb.Fatal(err)
	}
	cfg := driverConfig(tb)
	cfg.DBName = e.name
	cfg.InterpolateParams = !o.prepared
	if o.lockWait > 0 {
		if cfg.Params == nil {
			cfg.Params = map[string]string{}
		}
		cfg.Params["innodb_lock_wait_timeout"] = fmt.Sprint(o.lockWait)
	}
	c, err := mysql.NewConnector(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	e.db = sql.OpenDB(countingConnector{Connector: c, count: e.count})
	e.db.SetMaxOpenConns(cmpOr(o.maxConns, 8))
	tb.Cleanup(func() { _ = e.db.Close() })
	if e.s, err = idemmysql.New(e.db, &idemmysql.Config{MaxResultBytes: cmpOr(o.maxResult, 64), HolderConns: o.holderConns}); err != nil {
		tb.Fatal(err)
	}
	ctx := ctxT(tb)
	for i := range keys {
		key := fmt.Sprint("k", i)
		e.leases[key] = e.claim(tb, ctx, key)
	}
	return e
}

func cmpOr(a, b int) int {
	if a != 0 {
		return a
	}
	return b
}

// claim acquires key for a minute and returns its token.
func (e *holderEnv) claim(tb testing.TB, ctx context.Context, key string) int64 {
	tb.Helper()
	cl, err := e.s.Claim(ctx, idem.ClaimRequest{Scope: "s", Key: key, Fingerprint: idem.Fingerprint{1}, Lease: time.Minute})
	if err != nil || cl.Outcome != idem.Acquired {
		tb.Fatalf("claim %s: %+v, %v", key, cl, err)
	}
	return cl.Token
}

// lock holds the rows of keys, and only those (a scan of a small table
// would lock every row), in a transaction of the other pool until the
// returned release.
func (e *holderEnv) lock(t *testing.T, keys ...string) (release func()) {
	t.Helper()
	ctx := ctxT(t)
	tx, err := e.other.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	args := make([]any, len(keys))
	for i, k := range keys {
		args[i] = k
	}
	if _, err := tx.ExecContext(ctx, "SELECT * FROM idem_records FORCE INDEX (PRIMARY) WHERE scope = 's' AND `key` IN ("+
		strings.TrimSuffix(strings.Repeat("?, ", len(keys)), ", ")+") FOR UPDATE", args...); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() { once.Do(func() { _ = tx.Rollback() }) }
	t.Cleanup(release)
	return release
}

// lockWaits is how many statements of the database's sessions are in
// progress: in these tests, statements waiting on a row lock.
// information_schema.INNODB_TRX would say so itself, but MariaDB refreshes
// that view only when nobody read it for 100 ms, which a poll (and the
// package's parallel tests) would prevent.
func (e *holderEnv) lockWaits(t *testing.T) int {
	t.Helper()
	var n int
	err := e.other.QueryRow("SELECT COUNT(*) FROM information_schema.PROCESSLIST"+
		" WHERE DB = ? AND COMMAND IN ('Query', 'Execute') AND ID <> CONNECTION_ID()", e.name).Scan(&n)
	if err != nil {
		t.Fatalf("lock waits: %v", err)
	}
	return n
}

// waitLocked waits until n of the database's statements wait on a row lock.
func (e *holderEnv) waitLocked(t *testing.T, n int) {
	t.Helper()
	eventually(t, 30*time.Second, fmt.Sprintf("%d statements waiting on row locks", n), func() bool { return e.lockWaits(t) == n })
}

// waitRowLocked waits until some transaction holds the lock of key's row:
// a probe that skips locked rows no longer finds it. Unlike lockWaits, it
// tells a statement that has locked the row from one that has only begun.
func (e *holderEnv) waitRowLocked(t *testing.T, key string) {
	t.Helper()
	eventually(t, 30*time.Second, key+"'s row locked", func() bool {
		var k []byte
		err := e.other.QueryRow("SELECT `key` FROM idem_records FORCE INDEX (PRIMARY) WHERE scope = 's' AND `key` = ?"+
			" FOR UPDATE SKIP LOCKED", key).Scan(&k)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			t.Fatalf("probe %s's lock: %v", key, err)
		}
		return errors.Is(err, sql.ErrNoRows)
	})
}

// row is what the test reads of a record, by the server's clock.
type row struct {
	state                     string
	token                     int64
	lease, completed, expires sql.NullTime
	result                    []byte
	failed, tombstone         bool
	retention                 time.Duration // expires - completed
}

func (e *holderEnv) row(t *testing.T, key string) row {
	t.Helper()
	var (
		r  row
		us sql.NullInt64
	)
	// CAST to text and parse: the other pool's DSN has no parseTime.
	var lease, completed, expires sql.NullString
	err := e.other.QueryRow("SELECT state, token, CAST(lease_expires_at AS CHAR), CAST(completed_at AS CHAR), CAST(expires_at AS CHAR),"+
		" result, failed, tombstone, TIMESTAMPDIFF(MICROSECOND, completed_at, expires_at)"+
		" FROM idem_records WHERE scope = 's' AND `key` = ?", key).
		Scan(&r.state, &r.token, &lease, &completed, &expires, &r.result, &r.failed, &r.tombstone, &us)
	if err != nil {
		t.Fatalf("row %s: %v", key, err)
	}
	r.lease, r.completed, r.expires = parseTime(t, lease), parseTime(t, completed), parseTime(t, expires)
	r.retention = time.Duration(us.Int64) * time.Microsecond
	return r
}

func parseTime(t *testing.T, s sql.NullString) sql.NullTime {
	t.Helper()
	if !s.Valid {
		return sql.NullTime{}
	}
	tm, err := time.ParseInLocation("2006-01-02 15:04:05.999999", s.String, time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	return sql.NullTime{Time: tm, Valid: true}
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

// forModes runs test with interpolated parameters (ParseURL's default) and
// with prepared statements, in parallel.
func forModes(t *testing.T, test func(t *testing.T, prepared bool)) {
	for _, prepared := range []bool{false, true} {
		t.Run(map[bool]string{false: "interpolated", true: "prepared"}[prepared], func(t *testing.T) {
			t.Parallel()
			test(t, prepared)
		})
	}
}

// TestExtendsShareStatements: heartbeats that arrive while two others are
// in flight go out as one UPDATE and one SELECT, and each caller gets its
// own answer: the expiry of the lease it asked for (each a different
// length), or ErrLeaseLost for a stale token or a completed record, while
// the others in the same statement are extended.
func TestExtendsShareStatements(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, prepared bool) {
		const keys = 120
		e := newHolderEnv(t, keys, holderOpts{prepared: prepared})
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
			lease time.Duration
			until time.Time
			err   error
		}
		leaseOf := func(i int) time.Duration { return 2*time.Minute + time.Duration(i)*time.Second + 7*time.Microsecond }
		calls := []*call{{key: "k0", token: e.leases["k0"], lease: leaseOf(0)}, {key: "k1", token: e.leases["k1"], lease: leaseOf(1)}}
		var wg sync.WaitGroup
		extend := func(c *call) {
			wg.Go(func() { c.until, c.err = e.s.Extend(ctx, "s", c.key, c.token, c.lease) })
		}
		for _, c := range calls {
			extend(c)
		}
		e.waitLocked(t, 2)
		for i := 2; i < keys; i++ {
			key := fmt.Sprint("k", i)
			calls = append(calls, &call{key: key, token: e.leases[key], lease: leaseOf(i)})
		}
		calls = append(calls,
			&call{key: "k5", token: e.leases["k5"] - 1, lease: time.Hour}, // a stale token
			&call{key: "k7", token: e.leases["k7"], lease: leaseOf(7)},    // one holder's heartbeat twice
		)
		for _, c := range calls[2:] {
			extend(c)
		}
		eventually(t, 30*time.Second, "every other extend queued", func() bool { return idemmysql.ExtendsQueued(e.s) == len(calls)-2 })
		e.count.take("extend")
		e.count.take("extend read")
		release()
		wg.Wait()

		updates, reads := e.count.take("extend"), e.count.take("extend read")
		if updates < 1 || updates > 2 || reads != updates {
			t.Errorf("%d queued extends went out in %d UPDATEs and %d SELECTs, want 1 or 2 of each", len(calls)-2, updates, reads)
		}
		// Each group's statement has one clock: the queued calls' expiries
		// less their leases are one instant per statement.
		nows := map[time.Time]int{}
		for i, c := range calls {
			switch {
			case c.key == "k3" || i == len(calls)-2: // completed, stale token
				if !errors.Is(c.err, idem.ErrLeaseLost) || !strings.Contains(c.err.Error(), fmt.Sprintf("idemmysql: extend %q", c.key)) {
					t.Errorf("extend %s (token %d): %v, want ErrLeaseLost", c.key, c.token, c.err)
				}
			case c.err != nil:
				t.Errorf("extend %s: %v", c.key, c.err)
			default:
				r := e.row(t, c.key)
				if !r.lease.Time.Equal(c.until) || !r.expires.Time.Equal(c.until) || r.state != "in_progress" {
					t.Errorf("extend %s returned %v; the record's lease is %v, its expiry %v (%s)", c.key, c.until, r.lease.Time, r.expires.Time, r.state)
				}
				if now := c.until.Add(-c.lease); i >= 2 && (c.key != "k7" || i == len(calls)-1) {
					nows[now]++
				}
				if d := time.Until(c.until.Add(-c.lease)); d < -time.Minute || d > time.Minute {
					t.Errorf("extend %s: lease %v ends at %v, %v from now", c.key, c.lease, c.until, d)
				}
			}
		}
		if len(nows) < 1 || len(nows) > updates {
			t.Errorf("the extended leases were measured from %d instants (%v), want one per statement (%d)", len(nows), nows, updates)
		}
		// Both heartbeats of k7 got the record's one expiry.
		if calls[7].until != calls[len(calls)-1].until {
			t.Errorf("two heartbeats of k7 in one group: %v and %v", calls[7].until, calls[len(calls)-1].until)
		}
		if r := e.row(t, "k3"); r.state != "completed" || r.lease.Valid {
			t.Errorf("k3 after an extend of its completed record: %+v", r)
		}
		// The stale token's hour-long lease went nowhere.
		if r := e.row(t, "k5"); time.Until(r.lease.Time) > 10*time.Minute {
			t.Errorf("k5's lease ends in %v, extended by a stale token", time.Until(r.lease.Time))
		}
	})
}

// TestCompletesShareStatements: completions that arrive while two others
// are in flight go out as one transaction (one locking SELECT, one UPDATE),
// each with its own result, failure flag and retention, and its own
// answer: ErrLeaseLost for a stale token, and for the later of two
// completions of one lease (the earlier one's result is stored); a result over MaxResultBytes still becomes a tombstone, a nil
// result an empty one, and binary results arrive byte for byte.
func TestCompletesShareStatements(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, prepared bool) {
		const keys = 100
		e := newHolderEnv(t, keys, holderOpts{prepared: prepared})
		ctx := ctxT(t)
		release := e.lock(t, "k0", "k1")
		type call struct {
			req idem.CompleteRequest
			err error
		}
		complete := func(i int, token int64, result string) *call {
			return &call{req: idem.CompleteRequest{Scope: "s", Key: fmt.Sprint("k", i), Token: token, Result: []byte(result),
				Failed: i == 4, Retention: time.Hour + time.Duration(i)*time.Minute}}
		}
		calls := []*call{complete(0, e.leases["k0"], "r-k0"), complete(1, e.leases["k1"], "r-k1")}
		var wg sync.WaitGroup
		run := func(c *call) { wg.Go(func() { c.err = e.s.Complete(ctx, c.req) }) }
		for _, c := range calls {
			run(c)
		}
		e.waitLocked(t, 2)
		for i := 2; i < keys; i++ {
			key := fmt.Sprint("k", i)
			calls = append(calls, complete(i, e.leases[key], "r-"+key))
		}
		binary := []byte("\x00'\"\\\n\r\x1a\xff\xfe%_?\x00end")
		calls[6].req.Result = bytes.Repeat([]byte("x"), 65) // over MaxResultBytes
		calls[8].req.Result = nil                           // an empty result
		calls[9].req.Result = binary
		calls = append(calls,
			complete(5, e.leases["k5"]+1000, "stale"),          // a stale token
			complete(11, e.leases["k11"]-1, "stale and early"), // a stale token of a key completed in this group
		)
		for _, c := range calls[2:] {
			run(c)
		}
		eventually(t, 30*time.Second, "every other completion queued", func() bool { return idemmysql.CompletesQueued(e.s) == len(calls)-2 })
		// The same lease completed again, after the first (r-k7) queued: the
		// first wins, as one after the other.
		again := complete(7, e.leases["k7"], "r-k7-again")
		calls = append(calls, again)
		run(again)
		eventually(t, 30*time.Second, "the second completion of k7 queued", func() bool { return idemmysql.CompletesQueued(e.s) == len(calls)-2 })
		e.count.take("complete lock")
		e.count.take("complete")
		release()
		wg.Wait()

		locks, updates := e.count.take("complete lock"), e.count.take("complete")
		if locks < 1 || locks > 2 || updates != locks {
			t.Errorf("%d queued completions went out in %d locking SELECTs and %d UPDATEs, want 1 or 2 of each", len(calls)-2, locks, updates)
		}
		for _, c := range calls {
			key := c.req.Key
			switch {
			case c == again:
				if !errors.Is(c.err, idem.ErrLeaseLost) {
					t.Errorf("the second completion of k7: %v, want ErrLeaseLost", c.err)
				}
			case strings.HasPrefix(string(c.req.Result), "stale"):
				if !errors.Is(c.err, idem.ErrLeaseLost) || !strings.Contains(c.err.Error(), fmt.Sprintf("idemmysql: complete %q", key)) {
					t.Errorf("complete %s with a stale token: %v, want ErrLeaseLost", key, c.err)
				}
			case c.err != nil:
				t.Errorf("complete %s: %v", key, c.err)
			}
		}
		for i := range keys {
			key := fmt.Sprint("k", i)
			r := e.row(t, key)
			if r.state != "completed" || r.token != e.leases[key] || r.lease.Valid || !r.completed.Valid {
				t.Errorf("%s: %+v", key, r)
				continue
			}
			want, wantTomb := []byte("r-"+key), false
			switch i {
			case 6:
				want, wantTomb = nil, true
			case 8:
				want = []byte{}
			case 9:
				want = binary
			}
			if !bytes.Equal(r.result, want) || (r.result == nil) != (want == nil) || r.tombstone != wantTomb || r.failed != (i == 4) {
				t.Errorf("%s: result %q, failed %v, tombstone %v; want %q, failed %v, tombstone %v", key, r.result, r.failed, r.tombstone, want, i == 4, wantTomb)
			}
			if want := time.Hour + time.Duration(i)*time.Minute; r.retention != want {
				t.Errorf("%s: retention %v, want %v", key, r.retention, want)
			}
			if d := time.Since(r.completed.Time); d < -time.Minute || d > time.Minute {
				t.Errorf("%s: completed %v ago", key, d)
			}
		}
		// Through the store, an empty result is a result, not a tombstone.
		if rec, err := e.s.Get(ctx, "s", "k8"); err != nil || rec.Result == nil || len(rec.Result) != 0 || rec.Tombstone {
			t.Errorf("k8: %+v, %v", rec, err)
		}
	})
}

// TestHolderBurst: hundreds of lease holders heartbeating, then completing,
// at once from their own goroutines (no locks to make them queue), with
// stale tokens and completed records among them: every call gets its own
// right answer, and the calls were grouped.
func TestHolderBurst(t *testing.T) {
	t.Parallel()
	const keys = 300
	e := newHolderEnv(t, keys, holderOpts{})
	ctx := ctxT(t)
	for i := 0; i < keys; i += 10 {
		key := fmt.Sprint("k", i)
		if err := e.s.Complete(ctx, idem.CompleteRequest{Scope: "s", Key: key, Token: e.leases[key], Retention: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	lost := func(i int) bool { return i%10 == 0 || i%10 == 5 } // completed, or (below) a stale token
	token := func(i int) int64 {
		if i%10 == 5 {
			return e.leases[fmt.Sprint("k", i)] - 1
		}
		return e.leases[fmt.Sprint("k", i)]
	}
	for round := range 3 {
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range keys {
			wg.Go(func() {
				<-start
				key := fmt.Sprint("k", i)
				lease := time.Minute + time.Duration(i+round)*time.Second
				until, err := e.s.Extend(ctx, "s", key, token(i), lease)
				switch {
				case lost(i):
					if !errors.Is(err, idem.ErrLeaseLost) {
						t.Errorf("round %d: extend %s: %v, want ErrLeaseLost", round, key, err)
					}
				case err != nil:
					t.Errorf("round %d: extend %s: %v", round, key, err)
				default:
					if r := e.row(t, key); !r.lease.Time.Equal(until) {
						t.Errorf("round %d: extend %s returned %v, the record says %v", round, key, until, r.lease.Time)
					} else if d := time.Until(until.Add(-lease)); d < -time.Minute || d > time.Minute {
						t.Errorf("round %d: extend %s by %v: ends %v, %v from now", round, key, lease, until, d)
					}
				}
			})
		}
		close(start)
		wg.Wait()
	}
	if n := e.count.take("extend"); n == 0 {
		t.Errorf("%d rounds of %d concurrent heartbeats sent no group", 3, keys)
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range keys {
		wg.Go(func() {
			<-start
			key := fmt.Sprint("k", i)
			err := e.s.Complete(ctx, idem.CompleteRequest{Scope: "s", Key: key, Token: token(i), Result: []byte("r-" + key), Retention: time.Hour})
			if lost(i) != errors.Is(err, idem.ErrLeaseLost) || (!lost(i) && err != nil) {
				t.Errorf("complete %s: %v (lease lost: %v)", key, err, lost(i))
			}
		})
	}
	close(start)
	wg.Wait()
	if n := e.count.take("complete"); n == 0 {
		t.Errorf("%d concurrent completions sent no group", keys)
	}
	for i := range keys {
		key := fmt.Sprint("k", i)
		r := e.row(t, key)
		switch {
		case i%10 == 5:
			if r.state != "in_progress" {
				t.Errorf("%s, completed by a stale token: %+v", key, r)
			}
		case i%10 == 0:
			if r.state != "completed" || len(r.result) != 0 {
				t.Errorf("%s, completed before: %+v", key, r)
			}
		default:
			if r.state != "completed" || string(r.result) != "r-"+key {
				t.Errorf("%s: %+v", key, r)
			}
		}
	}
}

// TestHolderCallerGivesUpWhileQueued: a caller whose context ends while its
// call waits for a group gets its context's error at once, and its call
// leaves the queue (its lease is not extended, its record not completed);
// the others of the group still succeed.
func TestHolderCallerGivesUpWhileQueued(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"extend", "complete"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			const keys = 20
			e := newHolderEnv(t, keys, holderOpts{})
			ctx := ctxT(t)
			before := e.row(t, "k5")
			release := e.lock(t, "k0", "k1")
			queued := func() int {
				if kind == "extend" {
					return idemmysql.ExtendsQueued(e.s)
				}
				return idemmysql.CompletesQueued(e.s)
			}
			call := func(ctx context.Context, i int) error {
				key := fmt.Sprint("k", i)
				if kind == "extend" {
					_, err := e.s.Extend(ctx, "s", key, e.leases[key], time.Hour)
					return err
				}
				return e.s.Complete(ctx, idem.CompleteRequest{Scope: "s", Key: key, Token: e.leases[key], Retention: time.Hour})
			}
			errs := make([]error, keys)
			var wg sync.WaitGroup
			run := func(ctx context.Context, i int) { wg.Go(func() { errs[i] = call(ctx, i) }) }
			run(ctx, 0)
			run(ctx, 1)
			e.waitLocked(t, 2)
			cctx, cancel := context.WithCancel(ctx)
			defer cancel()
			cancelled := make(chan error, 1)
			for i := 2; i < keys; i++ {
				if i == 5 {
					go func() { cancelled <- call(cctx, i) }()
				} else {
					run(ctx, i)
				}
			}
			eventually(t, 30*time.Second, "the calls queued", func() bool { return queued() == keys-2 })
			cancel()
			// It returns while the rows are still locked, and leaves the queue.
			select {
			case errs[5] = <-cancelled:
			case <-time.After(30 * time.Second):
				t.Fatal("a call cancelled while queued did not return")
			}
			release()
			wg.Wait()
			if !errors.Is(errs[5], context.Canceled) || !strings.Contains(errs[5].Error(), "idemmysql: "+kind) {
				t.Errorf("%s k5, cancelled while queued: %v, want the context's error", kind, errs[5])
			}
			for i, err := range errs {
				if i != 5 && err != nil {
					t.Errorf("%s k%d: %v", kind, i, err)
				}
			}
			if after := e.row(t, "k5"); after.state != "in_progress" || !after.lease.Time.Equal(before.lease.Time) {
				t.Errorf("k5 after its %s was cancelled while queued: %+v, was %+v", kind, after, before)
			}
		})
	}
}

// TestHolderGroupEndsWithItsCallers: a group's statements do not end with
// its first caller, but they end with the last: rows locked by another
// transaction (the sessions wait up to 120 s for them) cannot hold a group,
// and its connection, after every caller has given up. A group of
// completions whose callers gave up commits nothing.
func TestHolderGroupEndsWithItsCallers(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"extend", "complete"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			const keys = 10
			e := newHolderEnv(t, keys, holderOpts{lockWait: 120})
			free := e.claim(t, ctxT(t), "free")
			all := make([]string, keys)
			for i := range all {
				all[i] = fmt.Sprint("k", i)
			}
			release := e.lock(t, all...)
			call := func(ctx context.Context, key string) error {
				if kind == "extend" {
					_, err := e.s.Extend(ctx, "s", key, e.leases[key], 5*time.Minute)
					return err
				}
				return e.s.Complete(ctx, idem.CompleteRequest{Scope: "s", Key: key, Token: e.leases[key], Retention: time.Hour})
			}
			errs := make([]error, keys)
			var wg sync.WaitGroup
			run := func(i int, timeout time.Duration) {
				wg.Go(func() {
					ctx, cancel := context.WithTimeout(context.Background(), timeout)
					defer cancel()
					errs[i] = call(ctx, all[i])
				})
			}
			// The lone calls give up first, so that the queued ones surely go
			// out as a group, which waits on the locks too.
			run(0, 2*time.Second)
			run(1, 2*time.Second)
			e.waitLocked(t, 2)
			for i := 2; i < keys; i++ {
				run(i, 4*time.Second)
			}
			wg.Wait()
			for i, err := range errs {
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("%s %s: %v, want the caller's deadline", kind, all[i], err)
				}
			}
			// The rows are still locked, yet every connection comes back...
			eventually(t, 30*time.Second, "the pool's connections released", func() bool { return e.db.Stats().InUse == 0 })
			// ...and the store goes on.
			if until, err := e.s.Extend(ctxT(t), "s", "free", free, 5*time.Minute); err != nil || time.Until(until) < 4*time.Minute {
				t.Errorf("extend of another key, the locks still held: %v, %v", until, err)
			}
			release()
			eventually(t, 30*time.Second, "the abandoned statements done", func() bool { return e.lockWaits(t) == 0 })
			for _, key := range all[:2] {
				// The lone calls' statements, which the server may finish after
				// their client has gone, as before groups.
				r := e.row(t, key)
				t.Logf("%s, whose lone %s gave up waiting on its lock: %s, lease ends in %v", key, kind, r.state, time.Until(r.lease.Time))
			}
			if kind == "complete" {
				// The server rolls back a transaction that was never committed.
				for _, key := range all[2:] {
					if r := e.row(t, key); r.state != "in_progress" {
						t.Errorf("%s: %s, completed by a group whose callers all gave up", key, r.state)
					}
				}
			}
			if err := call(ctxT(t), "k2"); err != nil {
				t.Errorf("%s after the locks went: %v", kind, err)
			}
		})
	}
}

// TestHolderGroupsSkipTheGate: the groups are lease holders' statements:
// with every connection open to claims taken by claims stuck on a row lock,
// a burst of heartbeats and completions still goes through, on the one
// connection kept for holders.
func TestHolderGroupsSkipTheGate(t *testing.T) {
	t.Parallel()
	const keys = 60
	e := newHolderEnv(t, keys, holderOpts{maxConns: 4, holderConns: 1})
	ctx := ctxT(t)
	// An expired lease that the claims try to take over, locked.
	e.claim(t, ctx, "hot")
	if _, err := e.other.Exec("UPDATE idem_records SET lease_expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE `key` = 'hot'"); err != nil {
		t.Fatal(err)
	}
	release := e.lock(t, "hot")
	var claims sync.WaitGroup
	for range 5 {
		claims.Go(func() {
			_, _ = e.s.Claim(ctx, idem.ClaimRequest{Scope: "s", Key: "hot", Fingerprint: idem.Fingerprint{1}, Lease: time.Minute})
		})
	}
	eventually(t, 30*time.Second, "the claims filling the gate", func() bool { return e.s.ConnStats().GatedWaiting >= 2 })
	hctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	burst := func(fn func(key string) error) {
		var wg sync.WaitGroup
		for i := range keys {
			wg.Go(func() {
				key := fmt.Sprint("k", i)
				if err := fn(key); err != nil {
					t.Errorf("%s behind stuck claims: %v", key, err)
				}
			})
		}
		wg.Wait()
	}
	e.count.take("extend")
	burst(func(key string) error {
		_, err := e.s.Extend(hctx, "s", key, e.leases[key], time.Minute)
		return err
	})
	burst(func(key string) error {
		return e.s.Complete(hctx, idem.CompleteRequest{Scope: "s", Key: key, Token: e.leases[key], Retention: time.Hour})
	})
	if e.count.take("extend") == 0 || e.count.take("complete") == 0 {
		t.Errorf("the bursts sent no group: the test did not test groups")
	}
	release()
	claims.Wait()
}

// TestHolderGroupRetriesDeadlock: a group that the server rolls back as the
// victim of a deadlock (another transaction locks its rows in the other
// order) runs again, and its calls succeed.
func TestHolderGroupRetriesDeadlock(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"extend", "complete"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := newHolderEnv(t, 4, holderOpts{})
			// The group statement that takes the locks (counted once the
			// server answers it).
			locking := map[string]string{"extend": "extend", "complete": "complete lock"}[kind]
			ctx := ctxT(t)
			if _, err := e.other.Exec("CREATE TABLE ballast (n INT NOT NULL)"); err != nil {
				t.Fatal(err)
			}
			call := func(key string) error {
				if kind == "extend" {
					_, err := e.s.Extend(ctx, "s", key, e.leases[key], 5*time.Minute)
					return err
				}
				return e.s.Complete(ctx, idem.CompleteRequest{Scope: "s", Key: key, Token: e.leases[key], Retention: time.Hour})
			}
			// Two lone calls wait on k0 and k1, so that k2 and k3 queue
			// into one group.
			release := e.lock(t, "k0", "k1")
			errs := map[string]error{}
			var mu sync.Mutex
			var wg sync.WaitGroup
			run := func(key string) {
				wg.Go(func() {
					err := call(key)
					mu.Lock()
					errs[key] = err
					mu.Unlock()
				})
			}
			run("k0")
			run("k1")
			e.waitLocked(t, 2)
			// The other transaction, heavier than the group (so that the
			// server picks the group as the victim), locks k3.
			other, err := e.other.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer other.Rollback()
			if _, err := other.ExecContext(ctx, "INSERT INTO ballast (n) VALUES "+strings.TrimSuffix(strings.Repeat("(1), ", 200), ", ")); err != nil {
				t.Fatal(err)
			}
			if _, err := other.ExecContext(ctx, "SELECT * FROM idem_records WHERE scope = 's' AND `key` = 'k3' FOR UPDATE"); err != nil {
				t.Fatal(err)
			}
			run("k2")
			run("k3")
			eventually(t, 30*time.Second, "k2 and k3 queued", func() bool {
				if kind == "extend" {
					return idemmysql.ExtendsQueued(e.s) == 2
				}
				return idemmysql.CompletesQueued(e.s) == 2
			})
			release() // the lone calls finish; the group locks k2 and waits on k3
			// Only the group locks k2. (A count of statements in progress
			// could see the group before it locked k2, or a lone call's
			// SELECT: the other transaction would then take k2 first, and
			// the group would wait on it with no deadlock.)
			e.waitRowLocked(t, "k2")
			// The other transaction asks for k2: a deadlock, and the group
			// is rolled back, retried, and waits on k3 again.
			if _, err := other.ExecContext(ctx, "SELECT * FROM idem_records WHERE scope = 's' AND `key` = 'k2' FOR UPDATE"); err != nil {
				t.Fatalf("the other transaction, which should have won the deadlock: %v", err)
			}
			// The group's statement came back while k3 was still locked: the
			// server rolled it back as the deadlock's victim.
			eventually(t, 30*time.Second, "the group rolled back", func() bool { return e.count.take(locking) == 1 })
			e.waitLocked(t, 1) // and it runs again, waiting on k3
			_ = other.Rollback()
			wg.Wait()
			if n := e.count.take(locking); n != 1 {
				t.Errorf("the group's locking statement ran %d more times after the deadlock, want 1 (the retry)", n)
			}
			for key, err := range errs {
				if err != nil {
					t.Errorf("%s %s: %v", kind, key, err)
				}
			}
			if kind == "complete" {
				for _, key := range []string{"k2", "k3"} {
					if r := e.row(t, key); r.state != "completed" {
						t.Errorf("%s: %+v", key, r)
					}
				}
			}
		})
	}
}

// TestCompletesBoundedBytes: large results that queue together are sent in
// groups of at most 4 MiB of results, so that no statement outgrows the
// server's max_allowed_packet (16 MiB on MariaDB): five results of 3.5 MiB
// (17.5 MiB together) are stored whole, next to small ones.
func TestCompletesBoundedBytes(t *testing.T) {
	t.Parallel()
	const keys, big = 12, 5
	e := newHolderEnv(t, keys, holderOpts{maxResult: 5 << 20})
	ctx := ctxT(t)
	var maxPacket int
	if err := e.other.QueryRow("SELECT @@max_allowed_packet").Scan(&maxPacket); err != nil {
		t.Fatal(err)
	}
	if maxPacket >= big*7<<19 {
		t.Skipf("max_allowed_packet is %d: the results would fit in one statement", maxPacket)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	results := make([][]byte, keys)
	for i := range results {
		n := 100
		if i >= 2 && i < 2+big {
			n = 7 << 19 // 3.5 MiB
		}
		results[i] = make([]byte, n)
		for j := range results[i] {
			results[i][j] = byte(rng.Uint32())
		}
	}
	release := e.lock(t, "k0", "k1")
	errs := make([]error, keys)
	var wg sync.WaitGroup
	run := func(i int) {
		wg.Go(func() {
			key := fmt.Sprint("k", i)
			errs[i] = e.s.Complete(ctx, idem.CompleteRequest{Scope: "s", Key: key, Token: e.leases[key], Result: results[i], Retention: time.Hour})
		})
	}
	run(0)
	run(1)
	e.waitLocked(t, 2)
	for i := 2; i < keys; i++ {
		run(i)
	}
	eventually(t, 30*time.Second, "the completions queued", func() bool { return idemmysql.CompletesQueued(e.s) == keys-2 })
	e.count.take("complete")
	release()
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("complete k%d (%d bytes): %v", i, len(results[i]), err)
		}
	}
	if n := e.count.take("complete"); n == 0 {
		t.Errorf("the completions sent no group: the test did not test groups")
	}
	for i := range keys {
		if r := e.row(t, fmt.Sprint("k", i)); r.state != "completed" || !bytes.Equal(r.result, results[i]) {
			t.Errorf("k%d: %s, %d bytes of result, want %d", i, r.state, len(r.result), len(results[i]))
		}
	}
}
