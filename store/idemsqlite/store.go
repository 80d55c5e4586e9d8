package idemsqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/storekit"
)

// Config configures a [Store]. A nil *Config means the defaults.
type Config struct {
	// MaxResultBytes bounds a stored result; a larger one turns the record
	// into a tombstone. Default idem.DefaultMaxResultBytes.
	MaxResultBytes int
	// Logger receives store diagnostics. Default slog.Default().
	Logger *slog.Logger
	// AutoMigrate makes [Open] apply pending migrations. Without it, Open
	// (and [Store.Ping]) fails on a database that is not fully migrated with
	// an error wrapping [ErrNotMigrated] that names the command to run.
	// [New] does no I/O and refuses it: migrate with [NewMigrator].
	AutoMigrate bool
}

// DefaultPurgeBatch is how many rows one Purge transaction deletes when the
// caller passes 0.
const DefaultPurgeBatch = 1000

// Store is the embedded idem.Store over one SQLite file. It is safe for
// concurrent use by many goroutines; several processes may share the file
// too (SQLite serialises their writes). It also offers the transactional
// path: [Store.Process], [Store.ProcessTx], [Store.ProcessBatch] and
// [Store.ProcessBatchTx].
//
// It satisfies [idem.Processor] with transactions of type *sql.Tx, so every
// broker adapter accepts it.
type Store struct {
	db        *sql.DB
	ownDB     bool
	pathOnce  sync.Once
	path      string
	maxResult int
	logger    *slog.Logger
	closed    atomic.Bool
	// writes queues this store's write transactions in Go. SQLite's busy
	// handler polls with growing sleeps and is not fair: with dozens of
	// goroutines on a loaded machine one waiter can lose every poll until
	// busy_timeout runs out. The queue hands the lock over in order, lease
	// holders first, so SQLite only arbitrates between processes (or other
	// pools).
	writes writeQueue
	// holders are the lease-holder writes waiting to share the next
	// holder transaction (see inHolderTx).
	holders holderQueue
	// stmts are the claim and complete paths' prepared statements.
	stmts hotStmts
	// batches counts the holder transactions run, for tests.
	batches atomic.Int64
	// writer is the connection the queued write transactions run on, held
	// while the write lock is. With its own connection a writer never waits
	// for the pool, which a burst of concurrent reads (conflicting claims,
	// replays) can empty.
	writer *sql.Conn
	// claimReads bounds the claims reading outside the write queue at once,
	// so that a burst of them leaves CPU and pool connections to the
	// writers.
	claimReads chan struct{}
	// now is the store clock: for an embedded database it is the process
	// clock, read once per transaction.
	now func() time.Time
}

var (
	_ idem.Store              = (*Store)(nil)
	_ idem.Durable            = (*Store)(nil)
	_ idem.Processor[*sql.Tx] = (*Store)(nil)
)

// Open opens (creating if needed) the SQLite database of dsn —
// "sqlite://path/to/file.db" or a plain path — with WAL, busy_timeout,
// foreign keys and BEGIN IMMEDIATE transactions, applies pending migrations
// with Config.AutoMigrate, and then checks the schema as [Store.Ping] does.
// Opening a file is I/O, so Open takes ctx; [New] over a *sql.DB does none.
func Open(ctx context.Context, dsn string, cfg *Config) (*Store, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	auto := c.AutoMigrate
	c.AutoMigrate = false
	db, err := OpenDB(ctx, dsn)
	if err != nil {
		return nil, err
	}
	s, err := New(db, &c)
	if err == nil && auto {
		m, _ := NewMigrator(db)
		var res MigrateResult
		if res, err = m.Up(ctx); err == nil && len(res.Versions) > 0 {
			s.logger.InfoContext(ctx, "idemsqlite: applied migrations", "path", s.Path(), "versions", res.Versions)
		}
	}
	if err == nil {
		err = s.Ping(ctx)
	}
	if err != nil {
		return nil, errors.Join(err, db.Close())
	}
	s.ownDB = true
	return s, nil
}

// New returns a Store over a *sql.DB the caller opened and keeps ownership
// of (Close does not close it). It validates cfg and does no I/O: call
// [Store.Ping] at start-up to fail early on a database that is not
// migrated. The database should be opened with busy_timeout and
// _txlock=immediate like [OpenDB] does; the store's own transactions begin
// with a write, so they wait for the lock even without _txlock, but a
// caller's transaction handed to [Store.ProcessTx] after it has read may
// fail with a retryable busy error.
func New(db *sql.DB, cfg *Config) (*Store, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: idemsqlite: nil *sql.DB", idem.ErrInvalidConfig)
	}
	s := &Store{db: db, maxResult: idem.DefaultMaxResultBytes, logger: slog.Default(), now: time.Now,
		claimReads: make(chan struct{}, 2)}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.MaxResultBytes < 0 {
		return nil, fmt.Errorf("%w: idemsqlite: MaxResultBytes must not be negative, got %d", idem.ErrInvalidConfig, c.MaxResultBytes)
	}
	if c.AutoMigrate {
		return nil, fmt.Errorf("%w: idemsqlite: New does no I/O, so it cannot AutoMigrate; use Open, or NewMigrator(db).Up", idem.ErrInvalidConfig)
	}
	if c.MaxResultBytes > 0 {
		s.maxResult = c.MaxResultBytes
	}
	if c.Logger != nil {
		s.logger = c.Logger
	}
	return s, nil
}

// Ping checks that the database answers and that its migrations are all
// applied: an error wrapping [ErrNotMigrated] (a [*NotMigratedError]) names
// the command to run.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.checkOpen(); err != nil {
		return err
	}
	m, _ := NewMigrator(s.db)
	v, err := m.Version(ctx)
	if err != nil {
		return err
	}
	if v < LatestVersion() {
		return &NotMigratedError{Path: s.Path(), Version: v, Latest: LatestVersion()}
	}
	return nil
}

// databasePath names the main database file, for error messages.
func databasePath(ctx context.Context, db *sql.DB) string {
	var seq int
	var name, file string
	if err := db.QueryRowContext(ctx, "SELECT seq, name, file FROM pragma_database_list WHERE name = 'main'").Scan(&seq, &name, &file); err != nil || file == "" {
		return "(unknown)"
	}
	return file
}

// DB returns the underlying database, for running the effects of the
// transactional path in your own transactions.
func (s *Store) DB() *sql.DB { return s.db }

// Path returns the database file the store uses (read from the database
// on first use).
func (s *Store) Path() string {
	s.pathOnce.Do(func() { s.path = databasePath(context.Background(), s.db) })
	return s.path
}

// Durable reports true: committed records survive restarts and power loss
// (synchronous=FULL in WAL mode).
func (s *Store) Durable() bool { return true }

// Close closes the database if [Open] opened it. Later calls fail with
// idem.ErrClosed.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	// Wait for the write in flight, then hand the writer connection back.
	_ = s.writes.lock(context.Background(), true)
	var err error
	if s.writer != nil {
		err = s.writer.Close()
		s.writer = nil
	}
	s.writes.unlock()
	err = errors.Join(err, s.stmts.close())
	if !s.ownDB {
		return err
	}
	return errors.Join(err, s.db.Close())
}

func (s *Store) checkOpen() error {
	if s.closed.Load() {
		return fmt.Errorf("idemsqlite: %w", idem.ErrClosed)
	}
	return nil
}

// micros is the store's time unit: unix microseconds.
func micros(t time.Time) int64 { return t.UnixMicro() }

func fromMicros(v sql.NullInt64) time.Time {
	if !v.Valid {
		return time.Time{}
	}
	return time.UnixMicro(v.Int64)
}

// inTx runs fn in one transaction (BEGIN IMMEDIATE with [OpenDB]'s DSN)
// with the store clock read once, and commits when fn returns nil.
func (s *Store) inTx(ctx context.Context, what string, fn func(tx *sql.Tx, now int64) error) error {
	return s.runTx(ctx, what, false, fn)
}

// inHolderTx runs fn for a lease holder (Extend, Complete, Release, the
// inbox's heartbeats): it goes ahead of every queued claim in the write
// queue, and the holder writes that queue up while one commits share the
// next transaction (group commit). Each commit costs an fsync; hundreds of
// leases heartbeating at once would otherwise need hundreds a second, more
// than a disk gives, and short leases would expire in the queue.
//
// fn must run its statements with the ctx it is given (not the caller's,
// which an interrupted statement would turn into a rollback of the whole
// shared transaction) and must return an error wrapping idem.ErrLeaseLost
// only when it changed nothing. Any other error fails every write of the
// shared transaction with it.
func (s *Store) inHolderTx(ctx context.Context, what string, fn func(ctx context.Context, tx *sql.Tx, now int64) error) error {
	return s.inSharedTx(ctx, what, true, fn)
}

// maxSharedOps bounds the writes one shared transaction takes along; the
// rest wait for the next one.
const maxSharedOps = 256

// inSharedTx runs fn in a transaction it shares with the other writes
// queued meanwhile (group commit): lease holders' writes (holder) and
// claims. A holder waits for the write lock ahead of every claim; whoever
// gets it first takes every queued write along, so claims and completions
// that arrive together share one commit and one fsync. fn follows
// inHolderTx's rules; errRollback, like ErrLeaseLost, says it changed
// nothing that must be kept.
func (s *Store) inSharedTx(ctx context.Context, what string, holder bool, fn func(ctx context.Context, tx *sql.Tx, now int64) error) error {
	if err := s.checkOpen(); err != nil {
		return err
	}
	op := &holderOp{ctx: ctx, what: what, fn: fn, done: make(chan struct{})}
	lctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	op.wake = func() { cancel(errBatched) }
	s.holders.mu.Lock()
	s.holders.pending = append(s.holders.pending, op)
	s.holders.mu.Unlock()

	// Wait for the write lock, or for a transaction that took op along.
	if err := s.writes.lock(lctx, holder); err != nil {
		select {
		case <-op.done:
			return op.err
		default:
		}
		s.holders.mu.Lock()
		queued := removeOp(&s.holders.pending, op)
		s.holders.mu.Unlock()
		if queued {
			return fmt.Errorf("idemsqlite: %s: waiting for the write lock: %w", what, err)
		}
		<-op.done // a transaction has it under way
		return op.err
	}
	defer s.writes.unlock()
	select {
	case <-op.done:
		return op.err
	default:
	}
	s.holders.mu.Lock()
	// op holds the lock, so it runs now, with the oldest of the others;
	// any beyond maxSharedOps go with the next transaction (each of their
	// owners is queued for the lock).
	others := s.holders.pending
	if i := slices.Index(others, op); i >= 0 {
		others = slices.Delete(others, i, i+1)
	}
	n := min(len(others), maxSharedOps-1)
	batch := append([]*holderOp{op}, others[:n]...)
	s.holders.pending = slices.Clone(others[n:])
	s.holders.mu.Unlock()
	s.runHolderBatch(batch)
	return op.err
}

// holderOp is one lease holder's write waiting for a transaction.
type holderOp struct {
	ctx  context.Context
	what string
	fn   func(ctx context.Context, tx *sql.Tx, now int64) error
	err  error
	done chan struct{} // closed once err is set
	wake func()        // ends the owner's wait for the write lock
}

// holderQueue holds the lease-holder writes waiting for a transaction.
type holderQueue struct {
	mu      sync.Mutex
	pending []*holderOp
}

// errBatched ends a holder's wait for the write lock: another holder's
// transaction has run its write.
var errBatched = errors.New("idemsqlite: written by a shared transaction")

func removeOp(ops *[]*holderOp, op *holderOp) bool {
	for i, o := range *ops {
		if o == op {
			*ops = append((*ops)[:i], (*ops)[i+1:]...)
			return true
		}
	}
	return false
}

// runHolderBatch runs the writes of batch in one transaction, with the
// store clock read once, and settles each one. The caller holds the write
// lock. A write that finds its lease lost changes nothing and fails alone;
// any other failure fails them all, and nothing is committed.
func (s *Store) runHolderBatch(batch []*holderOp) {
	defer func() {
		for _, op := range batch {
			close(op.done)
			op.wake()
		}
	}()
	failAll := func(step string, err error) {
		for _, op := range batch {
			op.err = fmt.Errorf("idemsqlite: %s: %s: %w", op.what, step, classify(err))
		}
	}
	// The statements run without the callers' cancellation: interrupting
	// one would roll the whole shared transaction back.
	bg := context.Background()
	s.batches.Add(1)
	tx, err := s.beginWrite(bg)
	if err != nil {
		failAll("begin", err)
		return
	}
	now, kept := micros(s.now()), 0
	for _, op := range batch {
		if err := op.ctx.Err(); err != nil {
			op.err = fmt.Errorf("idemsqlite: %s: %w", op.what, context.Cause(op.ctx))
			continue
		}
		op.err = op.fn(bg, tx, now)
		switch {
		case op.err == nil:
			kept++
		case !errors.Is(op.err, idem.ErrLeaseLost) && !errors.Is(op.err, errRollback):
			_ = tx.Rollback()
			cause := op.err
			for _, o := range batch {
				if o != op {
					o.err = fmt.Errorf("idemsqlite: %s: rolled back with another lease holder's write: %w", o.what, cause)
				}
			}
			return
		}
	}
	if kept == 0 {
		_ = tx.Rollback()
		return
	}
	if err := tx.Commit(); err != nil {
		for _, op := range batch {
			if op.err == nil {
				op.err = fmt.Errorf("idemsqlite: %s: commit: %w", op.what, classify(err))
			}
		}
	}
}

func (s *Store) runTx(ctx context.Context, what string, holder bool, fn func(tx *sql.Tx, now int64) error) error {
	if err := s.checkOpen(); err != nil {
		return err
	}
	if err := s.writes.lock(ctx, holder); err != nil {
		return fmt.Errorf("idemsqlite: %s: waiting for the write lock: %w", what, err)
	}
	defer s.writes.unlock()
	tx, err := s.beginWrite(ctx)
	if err != nil {
		return fmt.Errorf("idemsqlite: %s: begin: %w", what, classify(err))
	}
	// Rolled back in a defer, so that a panic in fn (a user's handler in
	// Process) does not leave the transaction, and SQLite's write lock,
	// open on the writer connection: it is not bound to ctx, so nothing
	// else would end it.
	done := false
	defer func() {
		if !done {
			_ = tx.Rollback()
		}
	}()
	if err := fn(tx, micros(s.now())); err != nil {
		return err
	}
	done = true
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("idemsqlite: %s: commit: %w", what, classify(err))
	}
	return nil
}

// beginWrite begins a transaction on the writer connection, opening it
// first or again after it broke. The caller holds the write lock.
//
// The transaction is not bound to ctx: runTx ends it, in the caller's
// goroutine, before it lets the next write in. A transaction bound to a
// context that ends is rolled back by database/sql from a goroutine of its
// own, and the next BEGIN on the writer connection could overtake that
// rollback ("cannot start a transaction within a transaction"). The
// statements inside still run with ctx, so cancelling it still interrupts
// them.
func (s *Store) beginWrite(ctx context.Context) (*sql.Tx, error) {
	if err := s.checkOpen(); err != nil {
		// Close ran while this write waited: do not take a connection
		// that nobody would hand back.
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	txCtx := context.WithoutCancel(ctx)
	if s.writer != nil {
		tx, err := s.writer.BeginTx(txCtx, nil)
		if !errors.Is(err, sql.ErrConnDone) && !errors.Is(err, driver.ErrBadConn) {
			return tx, err
		}
		_ = s.writer.Close()
		s.writer = nil
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	s.writer = conn
	return conn.BeginTx(txCtx, nil)
}

// errRollback makes inTx roll back without it being a failure.
var errRollback = errors.New("idemsqlite: rollback")

const recordColumns = `scope, key, state, fingerprint, token, result, failed, tombstone,
	created_at, lease_expires_at, completed_at, expires_at`

type scanner interface{ Scan(dest ...any) error }

func scanRecord(row scanner) (idem.Record, error) {
	var (
		rec                             idem.Record
		state                           string
		fp                              []byte
		created, lease, completed, expi sql.NullInt64
	)
	err := row.Scan(&rec.Scope, &rec.Key, &state, &fp, &rec.Token, &rec.Result, &rec.Failed, &rec.Tombstone,
		&created, &lease, &completed, &expi)
	if err != nil {
		return rec, err
	}
	if len(fp) != len(rec.Fingerprint) {
		return rec, fmt.Errorf("idemsqlite: record (%q, %q) has a %d-byte fingerprint", rec.Scope, rec.Key, len(fp))
	}
	copy(rec.Fingerprint[:], fp)
	rec.State = idem.State(state)
	rec.CreatedAt = fromMicros(created)
	rec.LeaseExpiresAt = fromMicros(lease)
	rec.CompletedAt = fromMicros(completed)
	rec.ExpiresAt = fromMicros(expi)
	return rec, nil
}

// getRecord reads one record; ok is false when there is none.
func getRecord(ctx context.Context, q queryRower, scope, key string) (rec idem.Record, ok bool, err error) {
	rec, err = scanRecord(q.QueryRowContext(ctx, "SELECT "+recordColumns+" FROM idem_records WHERE scope = ? AND key = ?", scope, key))
	if errors.Is(err, sql.ErrNoRows) {
		return rec, false, nil
	}
	if err != nil {
		return rec, false, fmt.Errorf("idemsqlite: read record: %w", classify(err))
	}
	return rec, true, nil
}

// Claim implements idem.Store.
//
// A claim that cannot acquire (the key is in progress, completed or
// mismatched) is answered from a plain read, outside the write queue: a
// burst of retries then neither waits for nor delays the writers, above all
// the holder's heartbeat. Only a claim that may acquire takes the write
// lock, and it decides again inside its transaction.
func (s *Store) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	if err := idem.ValidateClaim(req); err != nil {
		return idem.Claim{}, err
	}
	if err := s.checkOpen(); err != nil {
		return idem.Claim{}, err
	}
	select {
	case s.claimReads <- struct{}{}:
	case <-ctx.Done():
		return idem.Claim{}, fmt.Errorf("idemsqlite: claim: %w", context.Cause(ctx))
	}
	rec, found, err := getRecord(ctx, s.hot(nil), req.Scope, req.Key)
	<-s.claimReads
	if err != nil {
		return idem.Claim{}, err
	}
	// The clock is read after the row: a lease still live now was live
	// when the row was read, so InProgress is never answered for a lease
	// that had already expired.
	if out, ok := refuse(req, rec, found, micros(s.now())); ok {
		return out, nil
	}
	var out idem.Claim
	// The claim shares its transaction (and its commit) with the claims
	// and lease holders' writes queued meanwhile.
	err = s.inSharedTx(ctx, "claim", false, func(ctx context.Context, tx *sql.Tx, now int64) error {
		// Bump the counter first: the transaction's first statement is a
		// write, so it waits for the write lock (busy_timeout) even on a
		// *sql.DB opened without _txlock=immediate. A claim that acquires
		// nothing changes nothing else: its bump is rolled back, or
		// committed with the writes it shares the transaction with (a gap
		// in the tokens, which only have to increase).
		var token int64
		if err := s.hot(tx).QueryRowContext(ctx, "UPDATE idem_token_counter SET value = value + 1 WHERE id = 1 RETURNING value").Scan(&token); err != nil {
			return fmt.Errorf("idemsqlite: claim: next token: %w", classify(err))
		}
		rec, found, err := getRecord(ctx, s.hot(tx), req.Scope, req.Key)
		if err != nil {
			return err
		}
		if refused, ok := refuse(req, rec, found, now); ok {
			out = refused
			return errRollback
		}
		createdAt := now
		if found && !completedAndExpired(rec, now) {
			out.Takeover = true
			createdAt = micros(rec.CreatedAt)
		}
		leaseEnd := now + req.Lease.Microseconds()
		_, err = s.hot(tx).ExecContext(ctx, `INSERT INTO idem_records (`+recordColumns+`)
	VALUES (?, ?, 'in_progress', ?, ?, NULL, 0, 0, ?, ?, NULL, ?)
	ON CONFLICT (scope, key) DO UPDATE SET
		state = 'in_progress', fingerprint = excluded.fingerprint, token = excluded.token,
		result = NULL, failed = 0, tombstone = 0, created_at = excluded.created_at,
		lease_expires_at = excluded.lease_expires_at, completed_at = NULL, expires_at = excluded.expires_at`,
			req.Scope, req.Key, req.Fingerprint[:], token, createdAt, leaseEnd, leaseEnd)
		if err != nil {
			return fmt.Errorf("idemsqlite: claim: %w", classify(err))
		}
		out.Outcome, out.Token, out.LeaseExpiresAt = idem.Acquired, token, time.UnixMicro(leaseEnd)
		return nil
	})
	if errors.Is(err, errRollback) {
		err = nil
	}
	if err != nil {
		return idem.Claim{}, err
	}
	return out, nil
}

// completedAndExpired reports a completed record past its retention, which
// counts as absent.
func completedAndExpired(rec idem.Record, now int64) bool {
	return rec.State == idem.StateCompleted && micros(rec.ExpiresAt) <= now
}

// refuse decides whether a claim for req, finding rec (if found) at time
// now, must not acquire, and with which outcome: Mismatch, Completed or
// InProgress. ok is false when the key is free to acquire: absent, expired,
// or in progress with an expired lease (a takeover).
func refuse(req idem.ClaimRequest, rec idem.Record, found bool, now int64) (out idem.Claim, ok bool) {
	if !found || completedAndExpired(rec, now) {
		return idem.Claim{}, false
	}
	switch {
	case rec.Fingerprint != req.Fingerprint:
		return idem.Claim{Outcome: idem.Mismatch, Record: &rec}, true
	case rec.State == idem.StateCompleted:
		return idem.Claim{Outcome: idem.Completed, Record: &rec}, true
	case micros(rec.LeaseExpiresAt) > now:
		return idem.Claim{Outcome: idem.InProgress, Record: &rec}, true
	}
	return idem.Claim{}, false
}

// Complete implements idem.Store.
func (s *Store) Complete(ctx context.Context, req idem.CompleteRequest) error {
	if err := idem.ValidateComplete(req); err != nil {
		return err
	}
	result, tombstone := storekit.StoredResult(ctx, s.logger, "idemsqlite", req, s.maxResult)
	return s.inHolderTx(ctx, "complete", func(ctx context.Context, tx *sql.Tx, now int64) error {
		res, err := s.hot(tx).ExecContext(ctx, `UPDATE idem_records SET state = 'completed', result = ?, failed = ?, tombstone = ?,
	lease_expires_at = NULL, completed_at = ?, expires_at = ?
	WHERE scope = ? AND key = ? AND token = ? AND state = 'in_progress'`,
			result, req.Failed, tombstone, now, now+req.Retention.Microseconds(), req.Scope, req.Key, req.Token)
		return s.leaseHeld(res, err, "complete", req.Scope, req.Key, req.Token)
	})
}

// leaseHeld turns the outcome of a token-guarded write into ErrLeaseLost
// when it touched no row.
func (s *Store) leaseHeld(res sql.Result, err error, what, scope, key string, token int64) error {
	if err != nil {
		return fmt.Errorf("idemsqlite: %s: %w", what, classify(err))
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("idemsqlite: %s: %w", what, classify(err))
	}
	if n == 0 {
		return fmt.Errorf("%w: idemsqlite: %s (scope %q, key %q): token %d is not the current lease", idem.ErrLeaseLost, what, scope, key, token)
	}
	return nil
}

// Release implements idem.Store: the in-progress row of that token is
// deleted, so the next claim runs the operation again with a higher token.
func (s *Store) Release(ctx context.Context, scope, key string, token int64) error {
	if err := idem.Validate(scope, key); err != nil {
		return err
	}
	return s.inHolderTx(ctx, "release", func(ctx context.Context, tx *sql.Tx, _ int64) error {
		res, err := tx.ExecContext(ctx, "DELETE FROM idem_records WHERE scope = ? AND key = ? AND token = ? AND state = 'in_progress'", scope, key, token)
		return s.leaseHeld(res, err, "release", scope, key, token)
	})
}

// Extend implements idem.Store.
func (s *Store) Extend(ctx context.Context, scope, key string, token int64, lease time.Duration) (time.Time, error) {
	if err := idem.Validate(scope, key); err != nil {
		return time.Time{}, err
	}
	if lease <= 0 {
		return time.Time{}, fmt.Errorf("%w: lease must be positive, got %v", idem.ErrInvalidConfig, lease)
	}
	var until int64
	err := s.inHolderTx(ctx, "extend", func(ctx context.Context, tx *sql.Tx, now int64) error {
		until = now + lease.Microseconds()
		res, err := tx.ExecContext(ctx, `UPDATE idem_records SET lease_expires_at = ?, expires_at = ?
	WHERE scope = ? AND key = ? AND token = ? AND state = 'in_progress'`, until, until, scope, key, token)
		return s.leaseHeld(res, err, "extend", scope, key, token)
	})
	if err != nil {
		return time.Time{}, err
	}
	return time.UnixMicro(until), nil
}

// Get implements idem.Store.
func (s *Store) Get(ctx context.Context, scope, key string) (idem.Record, error) {
	if err := idem.Validate(scope, key); err != nil {
		return idem.Record{}, err
	}
	if err := s.checkOpen(); err != nil {
		return idem.Record{}, err
	}
	rec, ok, err := getRecord(ctx, s.db, scope, key)
	if err != nil {
		return idem.Record{}, err
	}
	if !ok {
		return idem.Record{}, fmt.Errorf("%w: scope %q, key %q", idem.ErrNotFound, scope, key)
	}
	return rec, nil
}

// Delete implements idem.Store.
func (s *Store) Delete(ctx context.Context, scope, key string) error {
	if err := idem.Validate(scope, key); err != nil {
		return err
	}
	return s.inTx(ctx, "delete", func(tx *sql.Tx, _ int64) error {
		steps, err := deleteSteps(ctx, tx, scope, key)
		if err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, "DELETE FROM idem_records WHERE scope = ? AND key = ?", scope, key)
		if err != nil {
			return fmt.Errorf("idemsqlite: delete: %w", classify(err))
		}
		if n, err := res.RowsAffected(); err != nil {
			return fmt.Errorf("idemsqlite: delete: %w", classify(err))
		} else if n == 0 && steps == 0 {
			return fmt.Errorf("%w: scope %q, key %q", idem.ErrNotFound, scope, key)
		}
		return nil
	})
}

// Purge implements idem.Store: each batch of at most limit rows is its own
// short transaction, so writers wait at most one batch. An in-progress
// record expires with its lease; purging it is the same as a takeover for
// its holder, whose Complete then fails with ErrLeaseLost.
func (s *Store) Purge(ctx context.Context, limit int) (int64, error) {
	if limit < 0 {
		return 0, fmt.Errorf("%w: idemsqlite: purge limit must not be negative, got %d", idem.ErrInvalidConfig, limit)
	}
	if limit == 0 {
		limit = DefaultPurgeBatch
	}
	n, err := s.inBatches(ctx, "purge", limit, func(tx *sql.Tx, now int64) (sql.Result, error) {
		res, err := tx.ExecContext(ctx, `DELETE FROM idem_records WHERE (scope, key) IN (
	SELECT scope, key FROM idem_records WHERE expires_at <= ? LIMIT ?)`, now, limit)
		if err != nil {
			return nil, fmt.Errorf("idemsqlite: purge: %w", classify(err))
		}
		return res, nil
	})
	if err == nil {
		err = s.purgeSteps(ctx, limit)
	}
	return n, err
}

// inBatches runs stmt, which changes at most limit rows, each time in a
// transaction of its own, until it changes fewer than limit rows or ctx
// ends, and returns the rows changed in all. stmt wraps its own errors.
func (s *Store) inBatches(ctx context.Context, op string, limit int, stmt func(tx *sql.Tx, now int64) (sql.Result, error)) (int64, error) {
	var total int64
	for {
		var n int64
		err := s.inTx(ctx, op, func(tx *sql.Tx, now int64) error {
			res, err := stmt(tx, now)
			if err != nil {
				return err
			}
			n, err = res.RowsAffected()
			return err
		})
		total += n
		if err != nil {
			return total, err
		}
		if n < int64(limit) {
			return total, nil
		}
		if err := ctx.Err(); err != nil {
			return total, fmt.Errorf("idemsqlite: %s: %w", op, err)
		}
	}
}
