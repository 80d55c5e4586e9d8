package idempgx

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/storekit"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Config configures a [Store]. A nil pointer, and zero fields, mean the
// defaults documented on each field.
type Config struct {
	// Schema holds the idem tables. Default "public".
	Schema string
	// MaxResultBytes bounds a stored result; a larger one turns the record
	// into a tombstone. Default idem.DefaultMaxResultBytes.
	MaxResultBytes int
	// Logger receives purge progress and retried races. Default
	// slog.Default().
	Logger *slog.Logger
	// PurgeBatch is how many rows one Purge statement deletes when Purge is
	// called with limit 0. Default 1000.
	PurgeBatch int
	// HolderConns is how many of the pool's connections (its MaxConns)
	// Claim, Get, Delete and Purge leave free at all times for lease
	// holders: Extend (the Guard's heartbeat), Complete and Release, so
	// that a burst of claims can never make a heartbeat wait for a
	// connection past the end of its lease. Default a quarter of MaxConns,
	// at least 1; it must be below MaxConns. A pool of one connection
	// keeps none (the store logs a warning). See "Lease holders go first"
	// in the package documentation.
	HolderConns int
	// Partitioned says that the schema's idem_records is the time-
	// partitioned layout made by [Migrator.Partition]: writes go to the
	// current partition, and [Store.Maintain] retires whole partitions
	// instead of deleting rows. It must match the schema ([Store.Ping]
	// checks). Default false, the plain table. See "Retention at scale" in
	// the package documentation.
	Partitioned bool
	// NoCopy keeps ProcessBatch on INSERT statements for every batch. By
	// default a batch of 64 or more distinct keys writes its records with
	// COPY (plain layout only; see "Batches written with COPY" in the package
	// documentation); set it for a connection pooler or proxy that does not
	// pass COPY through.
	NoCopy bool
}

// MaxBatch is the largest batch ProcessBatch accepts, so that one statement's
// parameters stay bounded.
const MaxBatch = 10000

// maxRaceRetries bounds how often an operation re-runs after a record changed
// between its two statements (deleted, purged or expired meanwhile). Each
// retry needs another writer to win a race, so this is never reached in
// practice; the bound only turns a livelock into an error.
const maxRaceRetries = 64

// Store is an [idem.Store] on PostgreSQL, plus the transactional path
// ([Store.Process], [Store.ProcessBatch] and their Tx variants). It is safe
// for concurrent use.
//
// It satisfies [idem.Processor] with transactions of type pgx.Tx, so every
// broker adapter accepts it.
type Store struct {
	pool   *pgxpool.Pool
	cfg    Config
	schema string
	q      queries
	sq     stepQueries
	// pipeline: the store's transactions send BEGIN with their first
	// statement (the pool's tracer, if any, sees batches; see lazyTx).
	pipeline bool

	// gate keeps HolderConns of the pool's maxConns connections from
	// every call but a lease holder's.
	gate            *storekit.Gate
	maxConns        int
	holderAcquires  atomic.Int64
	holderWaitNanos atomic.Int64

	// extends and completes send concurrent heartbeats, and concurrent
	// completions, as one statement each (coalesce.go).
	extends   *storekit.Coalescer[*extendCall]
	completes *storekit.Coalescer[*completeCall]

	// copy decides whether ProcessBatch's COPY path looks keys up first.
	copy copyPolicy
}

var (
	_ idem.Store             = (*Store)(nil)
	_ idem.Durable           = (*Store)(nil)
	_ idem.Processor[pgx.Tx] = (*Store)(nil)
)

// New returns a Store over pool. It does not touch the database; call
// [Store.Ping] at start-up to fail early on an unreachable server or an
// unmigrated schema.
func New(pool *pgxpool.Pool, cfg *Config) (*Store, error) {
	if pool == nil {
		return nil, errors.New("idempgx: nil pool")
	}
	s := &Store{pool: pool, pipeline: pipelines(pool)}
	if cfg != nil {
		s.cfg = *cfg
	}
	if s.cfg.Schema == "" {
		s.cfg.Schema = "public"
	}
	if s.cfg.MaxResultBytes < 0 {
		return nil, fmt.Errorf("%w: MaxResultBytes must not be negative, got %d", idem.ErrInvalidConfig, s.cfg.MaxResultBytes)
	}
	if s.cfg.MaxResultBytes == 0 {
		s.cfg.MaxResultBytes = idem.DefaultMaxResultBytes
	}
	if s.cfg.PurgeBatch < 0 {
		return nil, fmt.Errorf("%w: PurgeBatch must not be negative, got %d", idem.ErrInvalidConfig, s.cfg.PurgeBatch)
	}
	if s.cfg.PurgeBatch == 0 {
		s.cfg.PurgeBatch = 1000
	}
	if s.cfg.Logger == nil {
		s.cfg.Logger = slog.Default()
	}
	s.maxConns = int(pool.Config().MaxConns)
	holders, err := storekit.HolderConns(s.cfg.HolderConns, s.maxConns, "MaxConns")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", idem.ErrInvalidConfig, err)
	}
	if holders == 0 {
		s.cfg.Logger.Warn("idempgx: the pool has a single connection, so none can be kept for lease holders: " +
			"a heartbeat may wait behind a claim that waits on a row lock; give the pool MaxConns of 2 or more")
	}
	s.cfg.HolderConns = holders
	s.gate = storekit.NewGate(s.maxConns - holders)
	s.schema = s.cfg.Schema
	s.q = newQueries(s.schema, s.cfg.Partitioned)
	s.sq = newStepQueries(s.schema)
	s.newCoalescers()
	return s, nil
}

// Durable reports true: records are in PostgreSQL.
func (s *Store) Durable() bool { return true }

// Pool returns the pool the store uses. Queries run on it directly do not
// count against the connections kept for lease holders (Config.HolderConns).
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Config returns the effective configuration, defaults filled in.
func (s *Store) Config() Config { return s.cfg }

// Ping verifies that the server is reachable and the schema is fully
// migrated. It returns a [*NotMigratedError] (wrapping [ErrNotMigrated]) for
// a schema that is behind.
func (s *Store) Ping(ctx context.Context) error {
	m, err := NewMigrator(s.pool, &MigratorConfig{Schema: s.schema})
	if err != nil {
		return err
	}
	v, err := m.Version(ctx)
	if err != nil {
		return fmt.Errorf("idempgx: ping %s: %w", redactedTarget(s.pool), err)
	}
	if v < LatestVersion() {
		return &NotMigratedError{Schema: s.schema, Version: v, Want: LatestVersion()}
	}
	return s.checkLayout(ctx)
}

// redactedTarget names the server without credentials, for error messages.
func redactedTarget(pool *pgxpool.Pool) string {
	cc := pool.Config().ConnConfig
	return fmt.Sprintf("postgres at %s:%d/%s", cc.Host, cc.Port, cc.Database)
}

// wrap adds context to a database error, marks transient ones retryable and
// turns a missing idem table into ErrNotMigrated.
func (s *Store) wrap(op string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
		return fmt.Errorf("idempgx: %s: %w: schema %s has no idem tables; run `idem migrate up --store postgres://…` (%w)",
			op, ErrNotMigrated, s.schema, err)
	}
	return fmt.Errorf("idempgx: %s: %w", op, classify(err))
}

// micros converts a duration to whole microseconds, PostgreSQL's timestamp
// resolution, rounding up so that a positive duration never becomes zero.
func micros(d time.Duration) int64 {
	us := d / time.Microsecond
	if d%time.Microsecond != 0 {
		us++
	}
	return int64(us)
}

// recordColumns is the column list scanned by scanRecord.
const recordColumns = `scope, key, state, fingerprint, token, result, failed, tombstone,
	created_at, lease_expires_at, completed_at, expires_at`

// scanRecord reads recordColumns plus any extra destinations.
func scanRecord(row pgx.Row, extra ...any) (idem.Record, error) {
	var (
		r                  idem.Record
		state              string
		fp                 []byte
		lease, done, until *time.Time
	)
	dest := append([]any{&r.Scope, &r.Key, &state, &fp, &r.Token, &r.Result, &r.Failed, &r.Tombstone,
		&r.CreatedAt, &lease, &done, &until}, extra...)
	if err := row.Scan(dest...); err != nil {
		return idem.Record{}, err
	}
	r.State = idem.State(state)
	copy(r.Fingerprint[:], fp)
	if lease != nil {
		r.LeaseExpiresAt = *lease
	}
	if done != nil {
		r.CompletedAt = *done
	}
	if until != nil {
		r.ExpiresAt = *until
	}
	return r, nil
}

// Claim implements [idem.Store]. The common cases (a new key, a takeover,
// an expired completed record) take one statement; a key that is held,
// completed or mismatched takes a second one to read it.
func (s *Store) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	if err := idem.ValidateClaim(req); err != nil {
		return idem.Claim{}, err
	}
	conn, err := s.conn(ctx, "claim", false)
	if err != nil {
		return idem.Claim{}, err
	}
	defer s.done(conn, false)
	for range maxRaceRetries {
		var c idem.Claim
		err := s.writeRow(ctx, conn, s.q.claim, req.Scope, req.Key, req.Fingerprint[:], micros(req.Lease)).
			Scan(&c.Token, &c.LeaseExpiresAt, &c.Takeover)
		if err == nil {
			c.Outcome = idem.Acquired
			return c, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return idem.Claim{}, s.wrap("claim", err)
		}
		var liveLease, expired bool
		rec, err := scanRecord(conn.QueryRow(ctx, s.q.getLive, req.Scope, req.Key), &liveLease, &expired)
		if errors.Is(err, pgx.ErrNoRows) {
			continue // deleted or purged since the insert: claim again
		}
		if err != nil {
			return idem.Claim{}, s.wrap("claim", err)
		}
		switch {
		case rec.State == idem.StateCompleted && expired:
			continue // its retention ended since the insert
		case rec.Fingerprint != req.Fingerprint:
			return idem.Claim{Outcome: idem.Mismatch, Record: &rec}, nil
		case rec.State == idem.StateCompleted:
			return idem.Claim{Outcome: idem.Completed, Record: &rec}, nil
		case liveLease:
			return idem.Claim{Outcome: idem.InProgress, Record: &rec}, nil
		}
		// The lease expired since the insert: take it over.
		s.cfg.Logger.DebugContext(ctx, "idempgx: claim raced with a lease expiry, retrying", "scope", req.Scope, "key", req.Key)
	}
	return idem.Claim{}, idem.Retryable(fmt.Errorf("idempgx: claim: record kept changing under %d attempts", maxRaceRetries))
}

// Complete implements [idem.Store]. Concurrent Completes share one
// statement and one commit.
func (s *Store) Complete(ctx context.Context, req idem.CompleteRequest) error {
	if err := idem.ValidateComplete(req); err != nil {
		return err
	}
	result, tombstone := storekit.StoredResult(ctx, s.cfg.Logger, "idempgx", req, s.cfg.MaxResultBytes)
	c := &completeCall{scope: req.Scope, key: req.Key, token: req.Token, retention: micros(req.Retention),
		result: result, failed: req.Failed, tombstone: tombstone}
	return s.completes.Do(ctx, c)
}

// Release implements [idem.Store].
func (s *Store) Release(ctx context.Context, scope, key string, token int64) error {
	if err := idem.Validate(scope, key); err != nil {
		return err
	}
	conn, err := s.conn(ctx, "release", true)
	if err != nil {
		return err
	}
	defer s.done(conn, true)
	tag, err := conn.Exec(ctx, s.q.release, scope, key, token)
	if err != nil {
		return s.wrap("release", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("idempgx: release %q: %w", key, idem.ErrLeaseLost)
	}
	return nil
}

// Get implements [idem.Store].
func (s *Store) Get(ctx context.Context, scope, key string) (idem.Record, error) {
	if err := idem.Validate(scope, key); err != nil {
		return idem.Record{}, err
	}
	conn, err := s.conn(ctx, "get", false)
	if err != nil {
		return idem.Record{}, err
	}
	defer s.done(conn, false)
	rec, err := scanRecord(conn.QueryRow(ctx, s.q.get, scope, key))
	if errors.Is(err, pgx.ErrNoRows) {
		return idem.Record{}, fmt.Errorf("idempgx: get %q: %w", key, idem.ErrNotFound)
	}
	if err != nil {
		return idem.Record{}, s.wrap("get", err)
	}
	return rec, nil
}

// Delete implements [idem.Store].
func (s *Store) Delete(ctx context.Context, scope, key string) error {
	if err := idem.Validate(scope, key); err != nil {
		return err
	}
	conn, err := s.conn(ctx, "delete", false)
	if err != nil {
		return err
	}
	defer s.done(conn, false)
	// The record and its steps go in one transaction, the record first:
	// a step write in flight holds the record's row lock, and one that
	// comes after finds no lease.
	var tag, steps pgconn.CommandTag
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		var err error
		if tag, err = tx.Exec(ctx, s.q.delete, scope, key); err != nil {
			return err
		}
		steps, err = tx.Exec(ctx, s.sq.deleteAll, scope, key)
		return err
	})
	if err != nil {
		return s.wrap("delete", err)
	}
	if tag.RowsAffected() == 0 && steps.RowsAffected() == 0 {
		return fmt.Errorf("idempgx: delete %q: %w", key, idem.ErrNotFound)
	}
	return nil
}

// Purge implements [idem.Store]: each batch is one short autocommit
// statement that skips rows other transactions hold, so it never blocks
// claims for long and never holds one long transaction.
func (s *Store) Purge(ctx context.Context, limit int) (int64, error) {
	if limit < 0 {
		return 0, fmt.Errorf("%w: purge limit must not be negative, got %d", idem.ErrInvalidConfig, limit)
	}
	if limit == 0 {
		limit = s.cfg.PurgeBatch
	}
	var total int64
	for {
		tag, err := s.purgeBatch(ctx, limit)
		if err != nil {
			return total, err
		}
		n := tag.RowsAffected()
		total += n
		if n < int64(limit) {
			if total > 0 {
				s.cfg.Logger.DebugContext(ctx, "idempgx: purged expired records", "schema", s.schema, "rows", total)
			}
			return total, s.purgeSteps(ctx, limit)
		}
		if err := ctx.Err(); err != nil {
			return total, fmt.Errorf("idempgx: purge: %w", err)
		}
	}
}

// purgeBatch deletes up to limit expired rows, with a connection of its own
// so that a long purge lets claims in between its batches.
func (s *Store) purgeBatch(ctx context.Context, limit int) (pgconn.CommandTag, error) {
	conn, err := s.conn(ctx, "purge", false)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	defer s.done(conn, false)
	tag, err := conn.Exec(ctx, s.q.purge, limit)
	if err != nil {
		return tag, s.wrap("purge", err)
	}
	return tag, nil
}
