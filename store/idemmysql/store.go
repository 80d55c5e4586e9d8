package idemmysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/storekit"
)

// Config configures a [Store]. A nil pointer, and zero fields, mean the
// defaults documented on each field.
type Config struct {
	// MaxResultBytes bounds a stored result; a larger one turns the record
	// into a tombstone. Default idem.DefaultMaxResultBytes. Keep it below
	// the server's max_allowed_packet.
	MaxResultBytes int
	// Logger receives purge progress and retried races. Default
	// slog.Default().
	Logger *slog.Logger
	// PurgeBatch is how many rows one Purge statement deletes when Purge is
	// called with limit 0, and how many rows one statement of the inbox's
	// purge, redrive and discard touches. Default 1000.
	PurgeBatch int
	// HolderConns is how many of the *sql.DB's connections (its
	// SetMaxOpenConns, read when New runs) Claim, Get, Delete and Purge
	// leave free at all times for lease holders: Extend (the Guard's
	// heartbeat), Complete and Release, so that a burst of claims, or claims
	// waiting on a row lock, can never make a heartbeat wait for a
	// connection past the end of its lease. Default a quarter of
	// MaxOpenConns, at least 1; it must be below MaxOpenConns. A pool of one
	// connection keeps none (the store logs a warning); a pool without a
	// limit needs none.
	HolderConns int
}

// MaxBatch is the largest batch ProcessBatch accepts: one statement carries
// five parameters per message, and MySQL allows 65,535 placeholders in a
// statement.
const MaxBatch = 5000

// maxRaceRetries bounds how often an operation re-runs after a record changed
// between its statements (inserted, deleted, purged or expired meanwhile, or
// a deadlock that rolled the attempt back). Each retry needs another writer
// to win a race; the bound only turns a livelock into an error.
const maxRaceRetries = 64

// Store is an [idem.Store] on MySQL or MariaDB, plus the transactional path
// ([Store.Process], [Store.ProcessBatch] and their Tx variants). It is safe
// for concurrent use.
//
// It satisfies [idem.Processor] with transactions of type *sql.Tx, so every
// broker adapter accepts it.
type Store struct {
	db  *sql.DB
	cfg Config
	// gate keeps HolderConns of the pool's maxConns connections from
	// every call but a lease holder's; nil for a pool without a limit.
	gate     *storekit.Gate
	maxConns int
	// Lease holders' heartbeats and completions, sent in groups when
	// they come together (see coalesce.go).
	extends   *storekit.Coalescer[*extendCall]
	completes *storekit.Coalescer[*completeCall]
}

var (
	_ idem.Store              = (*Store)(nil)
	_ idem.Durable            = (*Store)(nil)
	_ idem.Processor[*sql.Tx] = (*Store)(nil)
)

// New returns a Store over db, a *sql.DB of github.com/go-sql-driver/mysql
// whose DSN names the database that holds the idem tables. It does not
// touch the database; call [Store.Ping] at start-up to fail early on an
// unreachable or too old server or an unmigrated database.
func New(db *sql.DB, cfg *Config) (*Store, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: idemmysql: nil *sql.DB", idem.ErrInvalidConfig)
	}
	s := &Store{db: db}
	if cfg != nil {
		s.cfg = *cfg
	}
	if s.cfg.MaxResultBytes < 0 {
		return nil, fmt.Errorf("%w: idemmysql: MaxResultBytes must not be negative, got %d", idem.ErrInvalidConfig, s.cfg.MaxResultBytes)
	}
	if s.cfg.MaxResultBytes == 0 {
		s.cfg.MaxResultBytes = idem.DefaultMaxResultBytes
	}
	if s.cfg.PurgeBatch < 0 {
		return nil, fmt.Errorf("%w: idemmysql: PurgeBatch must not be negative, got %d", idem.ErrInvalidConfig, s.cfg.PurgeBatch)
	}
	if s.cfg.PurgeBatch == 0 {
		s.cfg.PurgeBatch = 1000
	}
	if s.cfg.Logger == nil {
		s.cfg.Logger = slog.Default()
	}
	s.maxConns = db.Stats().MaxOpenConnections
	holders, err := storekit.HolderConns(s.cfg.HolderConns, s.maxConns, "SetMaxOpenConns")
	if err != nil {
		return nil, fmt.Errorf("%w: idemmysql: %v", idem.ErrInvalidConfig, err)
	}
	if holders == 0 && s.maxConns == 1 {
		s.cfg.Logger.Warn("idemmysql: the pool has a single connection, so none can be kept for lease holders: " +
			"a heartbeat may wait behind a claim that waits on a row lock; give the pool SetMaxOpenConns of 2 or more")
	}
	s.cfg.HolderConns = holders
	if s.maxConns > 0 {
		s.gate = storekit.NewGate(s.maxConns - holders)
	}
	s.newCoalescers()
	return s, nil
}

// Durable reports true: records are in InnoDB tables.
func (s *Store) Durable() bool { return true }

// DB returns the database the store uses, for running the effects of the
// transactional path in your own transactions.
func (s *Store) DB() *sql.DB { return s.db }

// Config returns the effective configuration, defaults filled in.
func (s *Store) Config() Config { return s.cfg }

// Ping verifies that the server is reachable and recent enough (see
// [CheckServerVersion]) and that the database is fully migrated. It returns
// a [*NotMigratedError] (wrapping [ErrNotMigrated]) for a database that is
// behind.
func (s *Store) Ping(ctx context.Context) error {
	if err := checkServer(ctx, s.db); err != nil {
		return err
	}
	m, err := NewMigrator(s.db)
	if err != nil {
		return err
	}
	v, err := m.Version(ctx)
	if err != nil {
		return fmt.Errorf("idemmysql: ping: %w", err)
	}
	if v < LatestVersion() {
		db, _ := currentDatabase(ctx, s.db)
		return &NotMigratedError{Database: db, Version: v, Want: LatestVersion()}
	}
	return nil
}

// wrap adds context to a database error, marks transient ones retryable and
// turns a missing idem table into ErrNotMigrated.
func (s *Store) wrap(op string, err error) error { return wrapErr(op, err) }

func wrapErr(op string, err error) error {
	if errNumber(err) == erNoSuchTable {
		return fmt.Errorf("idemmysql: %s: %w: the database has no idem tables; run `idem migrate up --store mysql://…` (%w)",
			op, ErrNotMigrated, err)
	}
	return fmt.Errorf("idemmysql: %s: %w", op, classify(err))
}

// micros converts a duration to whole microseconds, the resolution of
// DATETIME(6), rounding up so that a positive duration never becomes zero.
func micros(d time.Duration) int64 {
	us := d / time.Microsecond
	if d%time.Microsecond != 0 {
		us++
	}
	return int64(us)
}

// dbTime scans a DATETIME(6) that holds a UTC wall-clock time, whatever the
// DSN's parseTime and loc say: the driver hands over either text or a
// time.Time whose wall clock is the stored one.
type dbTime struct {
	t     time.Time
	valid bool
}

// datetimeLayout is how MySQL writes a DATETIME(6).
const datetimeLayout = "2006-01-02 15:04:05.999999"

func (d *dbTime) Scan(v any) error {
	switch x := v.(type) {
	case nil:
		*d = dbTime{}
		return nil
	case time.Time:
		d.t = time.Date(x.Year(), x.Month(), x.Day(), x.Hour(), x.Minute(), x.Second(), x.Nanosecond(), time.UTC)
	case []byte:
		return d.parse(string(x))
	case string:
		return d.parse(x)
	default:
		return fmt.Errorf("idemmysql: cannot scan %T into a time", v)
	}
	d.valid = true
	return nil
}

func (d *dbTime) parse(s string) error {
	t, err := time.ParseInLocation(datetimeLayout, s, time.UTC)
	if err != nil {
		return fmt.Errorf("idemmysql: bad DATETIME %q: %w", s, err)
	}
	d.t, d.valid = t, true
	return nil
}

// dt formats a UTC time as a DATETIME(6) literal. Times are passed as text
// so that the DSN's loc cannot shift them.
func dt(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000000") }

// time returns the scanned time, or the zero time for NULL.
func (d dbTime) time() time.Time {
	if !d.valid {
		return time.Time{}
	}
	return d.t
}

// nowSQL is the store clock: the server's UTC time, constant within one
// statement.
const nowSQL = "UTC_TIMESTAMP(6)"

// recordColumns is the column list scanned by scanRecord.
const recordColumns = "r.scope, r.`key`, r.state, r.fingerprint, r.token, r.result, r.failed, r.tombstone, " +
	"r.created_at, r.lease_expires_at, r.completed_at, r.expires_at"

// liveColumns follow recordColumns where a decision needs them: whether the
// lease is live and whether the retention has passed, by the server clock.
const liveColumns = "COALESCE(r.lease_expires_at > " + nowSQL + ", FALSE), r.expires_at <= " + nowSQL

type scanner interface{ Scan(dest ...any) error }

// scanRecord reads recordColumns plus any extra destinations.
func scanRecord(row scanner, extra ...any) (idem.Record, error) {
	var (
		r                                  idem.Record
		scope, key, state, fp              []byte
		created, lease, completed, expires dbTime
	)
	dest := append([]any{&scope, &key, &state, &fp, &r.Token, &r.Result, &r.Failed, &r.Tombstone,
		&created, &lease, &completed, &expires}, extra...)
	if err := row.Scan(dest...); err != nil {
		return idem.Record{}, err
	}
	if len(fp) != len(r.Fingerprint) {
		return idem.Record{}, fmt.Errorf("idemmysql: record (%q, %q) has a %d-byte fingerprint", scope, key, len(fp))
	}
	r.Scope, r.Key, r.State = string(scope), string(key), idem.State(state)
	copy(r.Fingerprint[:], fp)
	if r.State == idem.StateCompleted && !r.Tombstone && r.Result == nil {
		r.Result = []byte{}
	}
	r.CreatedAt, r.LeaseExpiresAt, r.CompletedAt, r.ExpiresAt = created.time(), lease.time(), completed.time(), expires.time()
	return r, nil
}

// Claim implements [idem.Store]. A key that is held, completed or
// mismatched is answered from one plain read, without a lock or a write. A
// key that may be acquired takes a short transaction: a fresh fencing
// token, the row read under its lock, then an insert or a takeover.
func (s *Store) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	if err := idem.ValidateClaim(req); err != nil {
		return idem.Claim{}, err
	}
	var out idem.Claim
	err := s.gated(ctx, "claim", func() (err error) {
		out, err = s.claim(ctx, req)
		return err
	})
	return out, err
}

// claim is Claim once the call holds a slot of the gate.
func (s *Store) claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	for range maxRaceRetries {
		var live, expired bool
		rec, err := scanRecord(s.db.QueryRowContext(ctx, "SELECT "+recordColumns+", "+liveColumns+
			" FROM idem_records AS r WHERE r.scope = ? AND r.`key` = ?", req.Scope, req.Key), &live, &expired)
		switch {
		case errors.Is(err, sql.ErrNoRows):
		case err != nil:
			return idem.Claim{}, s.wrap("claim", err)
		default:
			if c, ok := refuse(req, rec, live, expired); ok {
				return c, nil
			}
		}
		c, done, err := s.acquire(ctx, req)
		if err != nil {
			return idem.Claim{}, err
		}
		if done {
			return c, nil
		}
		s.cfg.Logger.DebugContext(ctx, "idemmysql: claim raced with another writer, retrying", "scope", req.Scope, "key", req.Key)
	}
	return idem.Claim{}, idem.Retryable(fmt.Errorf("idemmysql: claim: record kept changing under %d attempts", maxRaceRetries))
}

// refuse decides whether a claim for req, finding rec, must not acquire, and
// with which outcome. ok is false when the key is free: a completed record
// past its retention, or a lease that expired (a takeover).
func refuse(req idem.ClaimRequest, rec idem.Record, live, expired bool) (idem.Claim, bool) {
	switch {
	case rec.State == idem.StateCompleted && expired:
		return idem.Claim{}, false
	case rec.Fingerprint != req.Fingerprint:
		return idem.Claim{Outcome: idem.Mismatch, Record: &rec}, true
	case rec.State == idem.StateCompleted:
		return idem.Claim{Outcome: idem.Completed, Record: &rec}, true
	case live:
		return idem.Claim{Outcome: idem.InProgress, Record: &rec}, true
	}
	return idem.Claim{}, false
}

// acquire tries to take the lease in one transaction. done is false when
// the attempt lost a race (a concurrent insert of the same key, a deadlock)
// and nothing was changed.
func (s *Store) acquire(ctx context.Context, req idem.ClaimRequest) (c idem.Claim, done bool, err error) {
	err = s.inTx(ctx, "claim", func(tx *sql.Tx) (bool, error) {
		token, err := newToken(ctx, tx, "idem_tokens")
		if err != nil {
			return false, s.wrap("claim: next token", err)
		}
		var (
			now           dbTime
			found         sql.NullString
			live, expired sql.NullBool
			rec           idem.Record
			fp            []byte
			created       dbTime
		)
		err = tx.QueryRowContext(ctx, "SELECT "+nowSQL+", r.state, r.fingerprint, r.created_at, "+liveColumns+
			" FROM (SELECT 1) AS d LEFT JOIN idem_records AS r ON r.scope = ? AND r.`key` = ? FOR UPDATE",
			req.Scope, req.Key).Scan(&now, &found, &fp, &created, &live, &expired)
		if err != nil {
			return false, s.wrap("claim", err)
		}
		leaseEnd := now.t.Add(time.Duration(micros(req.Lease)) * time.Microsecond)
		if !found.Valid {
			_, err := tx.ExecContext(ctx, "INSERT INTO idem_records (scope, `key`, state, fingerprint, token, created_at, lease_expires_at, expires_at)"+
				" VALUES (?, ?, 'in_progress', ?, ?, ?, ?, ?)", req.Scope, req.Key, req.Fingerprint[:], token, dt(now.t), dt(leaseEnd), dt(leaseEnd))
			if errNumber(err) == erDupEntry {
				return false, nil // a concurrent claim inserted it: read it again
			}
			if err != nil {
				return false, s.wrap("claim", err)
			}
			c, done = idem.Claim{Outcome: idem.Acquired, Token: token, LeaseExpiresAt: leaseEnd}, true
			return true, nil
		}
		rec.State = idem.State(found.String)
		copy(rec.Fingerprint[:], fp)
		if _, refused := refuse(req, rec, live.Bool, expired.Bool); refused {
			return false, nil // changed since the plain read: decide again
		}
		takeover := rec.State == idem.StateInProgress
		createdAt := now.t
		if takeover {
			createdAt = created.t
		}
		_, err = tx.ExecContext(ctx, "UPDATE idem_records SET state = 'in_progress', fingerprint = ?, token = ?, result = NULL, failed = FALSE,"+
			" tombstone = FALSE, created_at = ?, lease_expires_at = ?, completed_at = NULL, expires_at = ? WHERE scope = ? AND `key` = ?",
			req.Fingerprint[:], token, dt(createdAt), dt(leaseEnd), dt(leaseEnd), req.Scope, req.Key)
		if err != nil {
			return false, s.wrap("claim", err)
		}
		c, done = idem.Claim{Outcome: idem.Acquired, Token: token, Takeover: takeover, LeaseExpiresAt: leaseEnd}, true
		return true, nil
	})
	if isDeadlock(err) {
		return idem.Claim{}, false, nil // rolled back: try again
	}
	if err != nil {
		return idem.Claim{}, false, err
	}
	return c, done, nil
}

// newToken allocates a fencing token from the AUTO_INCREMENT of table.
func newToken(ctx context.Context, q execer, table string) (int64, error) {
	res, err := q.ExecContext(ctx, "INSERT INTO "+table+" () VALUES ()")
	if err != nil {
		return 0, err
	}
	return res.LastInsertId()
}

// execer is what *sql.DB, *sql.Conn and *sql.Tx have in common.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// changedOne turns a statement that must change one row into nil, or an
// error wrapping none when it changed nothing.
func (s *Store) changedOne(res sql.Result, err error, op, key string, none error) error {
	if err != nil {
		return s.wrap(op, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return s.wrap(op, err)
	}
	if n == 0 {
		return fmt.Errorf("idemmysql: %s %q: %w", op, key, none)
	}
	return nil
}

// Release implements [idem.Store]: the in-progress row of that token is
// deleted, so the next claim runs the operation again with a higher token.
func (s *Store) Release(ctx context.Context, scope, key string, token int64) error {
	if err := idem.Validate(scope, key); err != nil {
		return err
	}
	res, err := s.db.ExecContext(ctx, "DELETE FROM idem_records WHERE scope = ? AND `key` = ? AND token = ? AND state = 'in_progress'", scope, key, token)
	return s.changedOne(res, err, "release", key, idem.ErrLeaseLost)
}

// Get implements [idem.Store].
func (s *Store) Get(ctx context.Context, scope, key string) (idem.Record, error) {
	if err := idem.Validate(scope, key); err != nil {
		return idem.Record{}, err
	}
	var rec idem.Record
	err := s.gated(ctx, "get", func() error {
		r, err := scanRecord(s.db.QueryRowContext(ctx, "SELECT "+recordColumns+" FROM idem_records AS r WHERE r.scope = ? AND r.`key` = ?", scope, key))
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("idemmysql: get %q: %w", key, idem.ErrNotFound)
		}
		if err != nil {
			return s.wrap("get", err)
		}
		rec = r
		return nil
	})
	return rec, err
}

// Delete implements [idem.Store].
func (s *Store) Delete(ctx context.Context, scope, key string) error {
	if err := idem.Validate(scope, key); err != nil {
		return err
	}
	return s.gated(ctx, "delete", func() error {
		// The record and its steps go in one transaction, the record first:
		// a step write in flight holds the record's row lock, and one that
		// comes after finds no lease.
		var records, steps int64
		err := s.inTx(ctx, "delete", func(tx *sql.Tx) (bool, error) {
			res, err := tx.ExecContext(ctx, "DELETE FROM idem_records WHERE scope = ? AND `key` = ?", scope, key)
			if err == nil {
				records, err = res.RowsAffected()
			}
			if err == nil {
				res, err = tx.ExecContext(ctx, "DELETE FROM idem_steps WHERE scope = ? AND `key` = ?", scope, key)
			}
			if err == nil {
				steps, err = res.RowsAffected()
			}
			if err != nil {
				return false, s.wrap("delete", err)
			}
			return true, nil
		})
		if err == nil && records == 0 && steps == 0 {
			err = fmt.Errorf("idemmysql: delete %q: %w", key, idem.ErrNotFound)
		}
		return err
	})
}

// Purge implements [idem.Store]: each batch is one short transaction that
// locks up to limit expired rows with FOR UPDATE SKIP LOCKED (so it never
// waits on a claim or a transaction that is taking a row over) and deletes
// them. It then drops the spent rows of the token counters, keeping the
// newest.
func (s *Store) Purge(ctx context.Context, limit int) (int64, error) {
	if limit < 0 {
		return 0, fmt.Errorf("%w: purge limit must not be negative, got %d", idem.ErrInvalidConfig, limit)
	}
	if limit == 0 {
		limit = s.cfg.PurgeBatch
	}
	var total int64
	err := s.gated(ctx, "purge", func() (err error) {
		total, err = s.purge(ctx, limit)
		return err
	})
	return total, err
}

// purge is Purge once the call holds a slot of the gate: it uses one
// connection at a time.
func (s *Store) purge(ctx context.Context, limit int) (int64, error) {
	total, err := s.batches(ctx, "purge", limit, func(tx *sql.Tx) (int64, error) {
		rows, err := tx.QueryContext(ctx, "SELECT scope, `key` FROM idem_records WHERE expires_at <= "+nowSQL+
			" ORDER BY expires_at LIMIT ? FOR UPDATE SKIP LOCKED", limit)
		if err != nil {
			return 0, err
		}
		var args []any
		err = eachRow(rows, func(r *sql.Rows) error {
			var scope, key []byte
			if err := r.Scan(&scope, &key); err != nil {
				return err
			}
			args = append(args, scope, key)
			return nil
		})
		if err != nil || len(args) == 0 {
			return 0, err
		}
		res, err := tx.ExecContext(ctx, "DELETE FROM idem_records WHERE "+repeatJoin("(scope = ? AND `key` = ?)", " OR ", len(args)/2), args...)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	})
	if err != nil {
		return total, err
	}
	if total > 0 {
		s.cfg.Logger.DebugContext(ctx, "idemmysql: purged expired records", "rows", total)
	}
	if err := s.purgeTokens(ctx, "idem_tokens"); err != nil {
		return total, err
	}
	return total, s.purgeSteps(ctx, limit)
}

// purgeTokens deletes the spent rows of a token table, all but the newest.
// The AUTO_INCREMENT counter survives that (and restarts) on the supported
// servers, and keeping the newest row guards it even where it would not.
func (s *Store) purgeTokens(ctx context.Context, table string) error {
	var top sql.NullInt64
	if err := s.db.QueryRowContext(ctx, "SELECT MAX(id) FROM "+table).Scan(&top); err != nil {
		return s.wrap("purge tokens", err)
	}
	if !top.Valid {
		return nil
	}
	limit := s.cfg.PurgeBatch
	_, err := s.batches(ctx, "purge tokens", limit, func(tx *sql.Tx) (int64, error) {
		res, err := tx.ExecContext(ctx, "DELETE FROM "+table+" WHERE id < ? ORDER BY id LIMIT ?", top.Int64, limit)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	})
	return err
}

// batches runs stmt, which changes at most limit rows, each time in a short
// transaction of its own, until it changes fewer than limit rows or ctx
// ends, and returns the rows changed in all.
func (s *Store) batches(ctx context.Context, op string, limit int, stmt func(tx *sql.Tx) (int64, error)) (int64, error) {
	var total int64
	for {
		var n int64
		err := s.inTx(ctx, op, func(tx *sql.Tx) (bool, error) {
			var err error
			if n, err = stmt(tx); err != nil {
				return false, s.wrap(op, err)
			}
			return n > 0, nil
		})
		if err != nil {
			return total, err
		}
		total += n
		if n < int64(limit) {
			return total, nil
		}
		if err := ctx.Err(); err != nil {
			return total, fmt.Errorf("idemmysql: %s: %w", op, err)
		}
	}
}

// eachRow calls fn for every row and closes rows.
func eachRow(rows *sql.Rows, fn func(*sql.Rows) error) error {
	defer rows.Close()
	for rows.Next() {
		if err := fn(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// repeatJoin repeats s n times with sep between.
func repeatJoin(s, sep string, n int) string {
	if n <= 0 {
		return ""
	}
	return strings.Repeat(s+sep, n-1) + s
}
