package idemsqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest/storetest"
)

var quietLogger = slog.New(slog.DiscardHandler)

// newTestStore opens a migrated store over a new file in t.TempDir().
func newTestStore(t *testing.T, cfg *Config) *Store {
	t.Helper()
	var c Config
	if cfg != nil {
		c = *cfg
	}
	c.AutoMigrate = true
	if c.Logger == nil {
		c.Logger = quietLogger
	}
	s, err := Open(context.Background(), "sqlite://"+filepath.Join(t.TempDir(), "idem.db"), &c)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

const testMaxResult = 4096

func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) idem.Store {
		return newTestStore(t, &Config{MaxResultBytes: testMaxResult})
	}, &storetest.Options{MaxResultBytes: testMaxResult, ClockPrecision: time.Microsecond})
}

func TestListConformance(t *testing.T) {
	t.Parallel()
	storetest.RunList(t, func(t *testing.T) idem.Store { return newTestStore(t, nil) }, nil)
}

func TestListClosed(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, nil)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.List(context.Background(), idem.ListRequest{}); !errors.Is(err, idem.ErrClosed) {
		t.Fatalf("List on a closed store: want ErrClosed, got %v", err)
	}
}

// processEnv adapts the transactional path to the suite: the effect is a
// row in an effects table of the same database, written in the handler's
// transaction.
type processEnv struct{ s *Store }

func newProcessEnv(t *testing.T) storetest.ProcessEnv {
	s := newTestStore(t, nil)
	createEffects(t, s.DB())
	return processEnv{s}
}

func createEffects(t *testing.T, db *sql.DB) {
	t.Helper()
	if _, err := db.Exec("CREATE TABLE effects (key TEXT NOT NULL)"); err != nil {
		t.Fatalf("create effects: %v", err)
	}
}

func insertEffect(ctx context.Context, tx *sql.Tx, key string) error {
	_, err := tx.ExecContext(ctx, "INSERT INTO effects (key) VALUES (?)", key)
	return err
}

func (e processEnv) Process(ctx context.Context, msg idem.Message, fail error) (idem.Outcome, error) {
	return e.s.Process(ctx, msg, func(ctx context.Context, tx *sql.Tx) error {
		if err := insertEffect(ctx, tx, msg.Key); err != nil {
			return err
		}
		return fail
	})
}

func (e processEnv) ProcessBatch(ctx context.Context, msgs []idem.Message, fail error) ([]idem.Outcome, error) {
	return e.s.ProcessBatch(ctx, msgs, func(ctx context.Context, tx *sql.Tx, fresh []int) error {
		for _, i := range fresh {
			if err := insertEffect(ctx, tx, msgs[i].Key); err != nil {
				return err
			}
		}
		return fail
	})
}

func (e processEnv) Effects(ctx context.Context) (map[string]int, error) {
	return countEffects(ctx, e.s.DB())
}

func countEffects(ctx context.Context, db *sql.DB) (map[string]int, error) {
	rows, err := db.QueryContext(ctx, "SELECT key, count(*) FROM effects GROUP BY key")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var k string
		var n int
		if err := rows.Scan(&k, &n); err != nil {
			return nil, err
		}
		out[k] = n
	}
	return out, rows.Err()
}

func TestProcessConformance(t *testing.T) {
	t.Parallel()
	storetest.RunProcess(t, newProcessEnv)
}

func TestOpenNotMigrated(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "fresh.db")
	_, err := Open(context.Background(), "sqlite://"+path, nil)
	if !errors.Is(err, ErrNotMigrated) {
		t.Fatalf("Open of an unmigrated database: got %v, want ErrNotMigrated", err)
	}
	want := fmt.Sprintf("idem: sqlite store at %s is not migrated (at version 0 of %d); run `idem migrate up --store sqlite://%s`", path, LatestVersion(), path)
	if err.Error() != want {
		t.Errorf("error text:\n got %s\nwant %s", err, want)
	}
	var nm *NotMigratedError
	if !errors.As(err, &nm) || nm.Path != path || nm.Version != 0 || nm.Latest != LatestVersion() {
		t.Errorf("NotMigratedError = %+v", nm)
	}
}

func TestOpenNewerSchema(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, nil)
	if _, err := s.DB().Exec("INSERT INTO idem_migrations (version, name, applied_at) VALUES (99, 'future', 0)"); err != nil {
		t.Fatal(err)
	}
	_, err := Open(context.Background(), s.Path(), nil)
	if err == nil || !strings.Contains(err.Error(), "newer than this build") {
		t.Fatalf("Open of a database migrated by a newer idem: got %v", err)
	}
}

func TestParseDSN(t *testing.T) {
	t.Parallel()
	good := map[string]string{
		"sqlite://idem.db":          "idem.db",
		"sqlite:///var/lib/idem.db": "/var/lib/idem.db",
		"./data/idem.db":            "./data/idem.db",
		"/tmp/a?b#c%d.db":           "/tmp/a?b#c%d.db",
	}
	for dsn, want := range good {
		if got, err := ParseDSN(dsn); err != nil || got != want {
			t.Errorf("ParseDSN(%q) = %q, %v; want %q", dsn, got, err, want)
		}
	}
	for _, dsn := range []string{"", "sqlite://", ":memory:", "sqlite://:memory:", "file:x.db?mode=memory", "postgres://localhost/db", "a\x00b"} {
		if _, err := ParseDSN(dsn); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("ParseDSN(%q): got %v, want ErrInvalidConfig", dsn, err)
		}
	}
}

func TestOpenBadDSN(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, dsn := range []string{"postgres://localhost/db", ":memory:", "sqlite://"} {
		if s, err := Open(ctx, dsn, &Config{AutoMigrate: true}); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("Open(%q): got %v, %v; want ErrInvalidConfig", dsn, s, err)
		}
	}
	missingDir := filepath.Join(t.TempDir(), "no", "such", "dir", "idem.db")
	if _, err := Open(ctx, "sqlite://"+missingDir, &Config{AutoMigrate: true}); err == nil {
		t.Errorf("Open in a missing directory: want an error")
	}
	if _, err := Open(ctx, filepath.Join(t.TempDir(), "x.db"), &Config{MaxResultBytes: -1}); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("negative MaxResultBytes: got %v", err)
	}
	if _, err := New(nil, nil); err == nil {
		t.Errorf("New(nil): want an error")
	}
	if _, err := NewMigrator(nil); err == nil {
		t.Errorf("NewMigrator(nil): want an error")
	}
}

func TestNewWithCallersDB(t *testing.T) {
	t.Parallel()
	// A plain DSN without _txlock: the store's transactions start with a
	// write, so concurrent claims still wait for the lock.
	db, err := sql.Open(DriverName, "file:"+filepath.Join(t.TempDir(), "own.db")+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// New does no I/O: it cannot migrate, and Ping reports the schema.
	if _, err := New(db, &Config{AutoMigrate: true}); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("New with AutoMigrate: got %v, want ErrInvalidConfig", err)
	}
	s, err := New(db, nil)
	if err != nil {
		t.Fatalf("New on an unmigrated db: %v (it must not touch the db)", err)
	}
	var nm *NotMigratedError
	if err := s.Ping(context.Background()); !errors.Is(err, ErrNotMigrated) || !errors.As(err, &nm) || nm.Version != 0 || nm.Path == "" {
		t.Fatalf("Ping on an unmigrated db: got %v", err)
	}
	m, _ := NewMigrator(db)
	if _, err := m.Up(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.Ping(context.Background()); err != nil {
		t.Fatalf("Ping after migrating: %v", err)
	}
	hammerClaims(t, []*Store{s}, 32, 5)
	createEffects(t, db)
	processDuplicates(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := db.Ping(); err != nil {
		t.Errorf("Close of a store from New must not close the caller's db: %v", err)
	}
}

// hammerClaims runs goroutines×rounds claim+complete cycles on distinct
// keys spread over stores, plus one contended key, and fails on any error:
// busy_timeout and BEGIN IMMEDIATE must absorb all lock contention.
func hammerClaims(t *testing.T, stores []*Store, goroutines, rounds int) {
	t.Helper()
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, goroutines*rounds*2)
	acquired := make(chan int64, goroutines)
	for g := range goroutines {
		wg.Go(func() {
			s := stores[g%len(stores)]
			for r := range rounds {
				key := fmt.Sprintf("k-%d-%d", g, r)
				c, err := s.Claim(ctx, idem.ClaimRequest{Scope: "hammer", Key: key, Lease: time.Minute})
				if err != nil {
					errs <- err
					continue
				}
				if c.Outcome != idem.Acquired {
					errs <- fmt.Errorf("fresh key %s: outcome %v", key, c.Outcome)
					continue
				}
				if err := s.Complete(ctx, idem.CompleteRequest{Scope: "hammer", Key: key, Token: c.Token, Result: []byte("ok"), Retention: time.Hour}); err != nil {
					errs <- err
				}
			}
			c, err := s.Claim(ctx, idem.ClaimRequest{Scope: "hammer", Key: "shared", Lease: time.Minute})
			if err != nil {
				errs <- err
			} else if c.Outcome == idem.Acquired {
				acquired <- c.Token
			}
		})
	}
	wg.Wait()
	close(errs)
	close(acquired)
	for err := range errs {
		t.Errorf("concurrent claim: %v (retryable=%v, busy=%v)", err, idem.IsRetryable(err), isBusy(err))
	}
	if n := len(acquired); n != 1 {
		t.Errorf("shared key acquired %d times by %d goroutines, want exactly 1", n, goroutines)
	}
}

func TestConcurrentClaimsNoBusy(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, nil)
	// A second pool on the same file: its connections contend for SQLite's
	// file lock like another process would.
	other, err := Open(context.Background(), s.Path(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	hammerClaims(t, []*Store{s, other}, 64, 5)
}

func TestConcurrentProcessDuplicates(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, nil)
	createEffects(t, s.DB())
	processDuplicates(t, s)
}

// processDuplicates delivers one message from 64 goroutines at once and
// checks that exactly one delivery ran its effect.
func processDuplicates(t *testing.T, s *Store) {
	t.Helper()
	ctx := context.Background()
	msg := idem.Message{Scope: "consumer", Key: "order-1", Fingerprint: idem.FingerprintBytes([]byte("body"))}
	var wg sync.WaitGroup
	results := make([]idem.Outcome, 64)
	errs := make([]error, 64)
	for i := range results {
		wg.Go(func() {
			results[i], errs[i] = s.Process(ctx, msg, func(ctx context.Context, tx *sql.Tx) error {
				return insertEffect(ctx, tx, msg.Key)
			})
		})
	}
	wg.Wait()
	count := map[idem.Outcome]int{}
	for i, r := range results {
		if errs[i] != nil {
			t.Errorf("Process %d: %v", i, errs[i])
		}
		count[r]++
	}
	if count[idem.Processed] != 1 || count[idem.Duplicate] != 63 {
		t.Errorf("results = %v, want 1 processed and 63 duplicates", count)
	}
	effects, err := countEffects(ctx, s.DB())
	if err != nil {
		t.Fatal(err)
	}
	if effects[msg.Key] != 1 {
		t.Errorf("effects = %v, want exactly one", effects)
	}
}

// shiftClock moves the store's clock by d for the rest of the test.
func shiftClock(s *Store, d time.Duration) {
	s.now = func() time.Time { return time.Now().Add(d) }
}

func TestProcessAgainstGuardLease(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, nil)
	ctx := context.Background()
	f := idem.FingerprintBytes([]byte("m"))
	c, err := s.Claim(ctx, idem.ClaimRequest{Scope: "sc", Key: "k", Fingerprint: f, Lease: time.Minute})
	if err != nil || c.Outcome != idem.Acquired {
		t.Fatalf("claim: %v %v", c.Outcome, err)
	}
	msg := idem.Message{Scope: "sc", Key: "k", Fingerprint: f}
	ran := false
	handler := func(context.Context, *sql.Tx) error { ran = true; return nil }
	res, err := s.Process(ctx, msg, handler)
	if !errors.Is(err, idem.ErrInProgress) || res != "" || ran {
		t.Fatalf("Process on a live lease: %v, %v, ran=%v; want ErrInProgress", res, err, ran)
	}
	tx, err := s.DB().Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.ProcessBatchTx(ctx, tx, []idem.Message{msg}); !errors.Is(err, idem.ErrInProgress) {
		t.Errorf("ProcessBatchTx on a live lease: %v; want ErrInProgress", err)
	}
	_ = tx.Rollback()

	// After the lease, a message with another fingerprint is still a
	// mismatch, and the same one takes the key over.
	shiftClock(s, 2*time.Minute)
	other := msg
	other.Fingerprint = idem.FingerprintBytes([]byte("other"))
	if res, err := s.Process(ctx, other, handler); res != idem.Mismatch || !errors.Is(err, idem.ErrFingerprintMismatch) || ran {
		t.Fatalf("Process with another fingerprint after the lease: %v, %v", res, err)
	}
	if res, err := s.Process(ctx, msg, handler); res != idem.Processed || err != nil || !ran {
		t.Fatalf("Process after the lease expired: %v, %v, ran=%v", res, err, ran)
	}
	if err := s.Complete(ctx, idem.CompleteRequest{Scope: "sc", Key: "k", Token: c.Token, Retention: time.Hour}); !errors.Is(err, idem.ErrLeaseLost) {
		t.Errorf("Complete by the stale holder: %v, want ErrLeaseLost", err)
	}
	next, err := s.Claim(ctx, idem.ClaimRequest{Scope: "sc", Key: "k", Fingerprint: f, Lease: time.Minute})
	if err != nil || next.Outcome != idem.Completed {
		t.Errorf("Claim after Process: %v, %v; want Completed", next.Outcome, err)
	}
}

func TestProcessValidation(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, nil)
	ctx := context.Background()
	noop := func(context.Context, *sql.Tx) error { return nil }
	if _, err := s.Process(ctx, idem.Message{Key: ""}, noop); !errors.Is(err, idem.ErrInvalidKey) {
		t.Errorf("empty key: %v", err)
	}
	if _, err := s.Process(ctx, idem.Message{Key: "k", Retention: -1}, noop); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("negative retention: %v", err)
	}
	if _, err := s.ProcessTx(ctx, nil, idem.Message{Key: "k"}); err == nil {
		t.Errorf("nil tx: want an error")
	}
	if _, err := s.ProcessBatchTx(ctx, nil, []idem.Message{{Key: "k"}}); err == nil {
		t.Errorf("nil tx (batch): want an error")
	}
	if _, err := s.ProcessBatchTx(ctx, nil, []idem.Message{{Key: "ok"}, {Key: "bad\n"}}); !errors.Is(err, idem.ErrInvalidKey) {
		t.Errorf("batch with an invalid key: %v", err)
	}
	if _, err := s.ProcessBatch(ctx, make([]idem.Message, MaxBatch+1), nil); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("oversized batch: %v", err)
	}
	called := false
	res, err := s.ProcessBatch(ctx, nil, func(context.Context, *sql.Tx, []int) error { called = true; return nil })
	if err != nil || len(res) != 0 || called {
		t.Errorf("empty batch: %v, %v, called=%v", res, err, called)
	}
}

func TestPurgeInBatches(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, nil)
	ctx := context.Background()
	msgs := make([]idem.Message, 2500)
	for i := range msgs {
		msgs[i] = idem.Message{Scope: "p", Key: fmt.Sprintf("k%d", i), Retention: time.Minute}
	}
	noop := func(context.Context, *sql.Tx, []int) error { return nil }
	if _, err := s.ProcessBatch(ctx, msgs, noop); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ProcessBatch(ctx, []idem.Message{{Scope: "p", Key: "keep", Retention: time.Hour}}, noop); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Purge(ctx, 1000); err != nil || n != 0 {
		t.Fatalf("Purge before expiry: %d, %v", n, err)
	}
	shiftClock(s, 2*time.Minute)
	if n, err := s.Purge(ctx, 1000); err != nil || n != 2500 {
		t.Fatalf("Purge: %d, %v; want 2500", n, err)
	}
	if _, err := s.Get(ctx, "p", "keep"); err != nil {
		t.Errorf("unexpired record purged: %v", err)
	}
	if _, err := s.Purge(ctx, -1); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("negative limit: %v", err)
	}
}

func TestClosedStore(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, nil)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	ctx := context.Background()
	_, err := s.Claim(ctx, idem.ClaimRequest{Key: "k", Lease: time.Second})
	if !errors.Is(err, idem.ErrClosed) {
		t.Errorf("Claim after Close: %v", err)
	}
	if _, err := s.Get(ctx, "", "k"); !errors.Is(err, idem.ErrClosed) {
		t.Errorf("Get after Close: %v", err)
	}
	if _, err := s.Process(ctx, idem.Message{Key: "k"}, nil); !errors.Is(err, idem.ErrClosed) {
		t.Errorf("Process after Close: %v", err)
	}
}

type codedErr int

func (e codedErr) Error() string { return fmt.Sprintf("sqlite code %d", int(e)) }
func (e codedErr) Code() int     { return int(e) }

func TestClassify(t *testing.T) {
	t.Parallel()
	busy := []error{codedErr(5), codedErr(6), codedErr(5 | 2<<8), fmt.Errorf("wrapped: %w", codedErr(261)),
		errors.New("database is locked"), errors.New("SQLITE_BUSY: x")}
	for _, err := range busy {
		if got := classify(err); !idem.IsRetryable(got) || !errors.Is(got, err) {
			t.Errorf("classify(%v) = %v, want retryable wrapping it", err, got)
		}
	}
	for _, err := range []error{codedErr(19), errors.New("no such table: x")} {
		if idem.IsRetryable(classify(err)) {
			t.Errorf("classify(%v) must not be retryable", err)
		}
	}
	if classify(nil) != nil {
		t.Error("classify(nil) != nil")
	}
}

func TestDurable(t *testing.T) {
	t.Parallel()
	if !idem.IsDurable(newTestStore(t, nil)) {
		t.Error("the SQLite store is durable")
	}
}

// TestBusyIsRetryable holds the write lock from another connection past the
// store's busy timeout: the store must give up with a retryable error and
// leave nothing behind.
func TestBusyIsRetryable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "busy.db")
	if s, err := Open(ctx, path, &Config{AutoMigrate: true, Logger: quietLogger}); err != nil {
		t.Fatal(err)
	} else {
		s.Close()
	}
	db, err := sql.Open(DriverName, "file:"+path+"?_pragma=busy_timeout(50)&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s, err := New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	holder, err := OpenDB(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	tx, err := holder.BeginTx(ctx, nil) // BEGIN IMMEDIATE: takes the write lock
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()

	_, err = s.Claim(ctx, idem.ClaimRequest{Key: "k", Lease: time.Minute})
	if !idem.IsRetryable(err) {
		t.Errorf("Claim while another connection holds the lock: %v, want a retryable error", err)
	}
	_, err = s.Process(ctx, idem.Message{Key: "k"}, func(context.Context, *sql.Tx) error { return nil })
	if !idem.IsRetryable(err) {
		t.Errorf("Process while another connection holds the lock: %v, want a retryable error", err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "", "k"); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("a busy failure must record nothing: %v", err)
	}
}

// TestWriteAfterCancelledTransaction: a write whose context ends inside its
// transaction must leave the writer connection ready for the next write.
// database/sql rolls such a transaction back from a goroutine of its own;
// a next BEGIN that overtook that rollback failed with "cannot start a
// transaction within a transaction" (an inbox heartbeat timing out mid-write
// made the following Complete fail this way).
func TestWriteAfterCancelledTransaction(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, nil)
	ctx := context.Background()
	for i := range 300 {
		cctx, cancel := context.WithCancel(ctx)
		err := s.inTx(cctx, "cancelled write", func(tx *sql.Tx, now int64) error {
			if _, err := tx.ExecContext(cctx, `DELETE FROM idem_records WHERE scope = 'none'`); err != nil {
				return err
			}
			cancel()
			return context.Canceled
		})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("write %d: cancelled transaction = %v, want context.Canceled", i, err)
		}
		err = s.inTx(ctx, "next write", func(tx *sql.Tx, now int64) error {
			_, err := tx.ExecContext(ctx, `DELETE FROM idem_records WHERE scope = 'none'`)
			return err
		})
		if err != nil {
			t.Fatalf("write %d after a cancelled one: %v", i, err)
		}
	}
}

// TestWriteAfterFailedCommit: a COMMIT that fails (here on a deferred
// foreign key) leaves SQLite's transaction open; the next write must not
// inherit it.
func TestWriteAfterFailedCommit(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, nil)
	ctx := context.Background()
	err := s.inTx(ctx, "schema", func(tx *sql.Tx, now int64) error {
		_, err := tx.ExecContext(ctx, `CREATE TABLE parent (id INTEGER PRIMARY KEY);
CREATE TABLE child (parent_id INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED)`)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	err = s.inTx(ctx, "orphan", func(tx *sql.Tx, now int64) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO child (parent_id) VALUES (42)`)
		return err
	})
	if err == nil || !strings.Contains(err.Error(), "commit") {
		t.Fatalf("commit of an orphan row = %v, want a commit error", err)
	}
	err = s.inTx(ctx, "next write", func(tx *sql.Tx, now int64) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO parent (id) VALUES (1)`)
		return err
	})
	if err != nil {
		t.Fatalf("write after a failed commit: %v", err)
	}
	var orphans int
	if err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM child`).Scan(&orphans); err != nil || orphans != 0 {
		t.Fatalf("orphan rows = %d, %v: the failed transaction must not be committed later", orphans, err)
	}
}

// Ping fails on a closed store and on a database that cannot answer.
func TestPingFailures(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newTestStore(t, nil)
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping on a migrated store: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Ping(ctx); !errors.Is(err, idem.ErrClosed) {
		t.Fatalf("Ping after Close: got %v, want ErrClosed", err)
	}
	db, err := OpenDB(ctx, "sqlite://"+filepath.Join(t.TempDir(), "gone.db"))
	if err != nil {
		t.Fatal(err)
	}
	other, err := New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = db.Close()
	if err := other.Ping(ctx); err == nil || errors.Is(err, ErrNotMigrated) {
		t.Fatalf("Ping over a closed *sql.DB: got %v, want the database's error", err)
	}
}
