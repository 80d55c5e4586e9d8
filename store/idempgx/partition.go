package idempgx

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The partitioned layout (opt-in, see "Retention at scale" in the package
// documentation).
//
// idem_records is PARTITION BY LIST (bucket), one partition per bucket
// number, named idem_records_p<bucket>; idem_record_buckets holds the
// current bucket, the only one written to. A partitioned table's unique
// key must contain its partition key, so the primary key is (scope, key,
// bucket), which alone would let a key have one row per bucket. Uniqueness
// of (scope, key) across partitions is kept by the writes, in two parts:
//
//   - every statement that may create a record first checks the other
//     partitions for the key (an index probe per partition) and inserts
//     into the current one only if there is none, or if the row it found
//     is one to take over (an expired record, an expired lease of the same
//     content), which the same statement deletes;
//   - that check must see every record that a concurrent write put in an
//     older bucket. Each such write runs, in the same transaction and just
//     before it, SELECT pg_advisory_xact_lock_shared(k); a rotation takes
//     the same lock exclusively, so it waits until every write of the old
//     bucket has committed or rolled back, and every write that reads the
//     new bucket starts its statement, and so its snapshot, after that.
//     Two writes of the same bucket meet on that partition's primary key
//     (ON CONFLICT), as in the plain layout.
//
// Compared with the plain layout, each such write pays one advisory lock
// more, sent in the same round trip (a pipelined batch), and one index
// probe per other partition.

const (
	bucketsTable    = "idem_record_buckets"
	partitionStem   = "idem_records_p"
	defaultInterval = 24 * time.Hour
)

// detachMark is the comment Maintain puts on a partition it is about to
// detach and drop.
const detachMark = "idem: expired partition, being dropped by Maintain"

var partitionName = regexp.MustCompile(`^idem_records_p([0-9]+)$`)

// ErrNotPartitioned is returned by [Store.Maintain] and [Store.Partitions]
// on a store whose Config.Partitioned is false, and wrapped by [Store.Ping] when
// Config.Partitioned does not match the schema's layout.
var ErrNotPartitioned = errors.New("idempgx: the idem_records layout does not match Config.Partitioned")

// lockKey names the schema's bucket lock for hashtextextended.
func lockKey(schema string) string { return "idem-bucket:" + schema }

func newPartitionedQueries(schema string) queries {
	q := newQueries(schema, false)
	t := pgx.Identifier{schema, "idem_records"}.Sanitize()
	cur := `(SELECT cur FROM ` + pgx.Identifier{schema, bucketsTable}.Sanitize() + `)`
	q.lockShared = `SELECT pg_advisory_xact_lock_shared(hashtextextended($1, 0))`
	q.planLookup = true
	// elsewhere finds the key's row in a partition other than the current
	// one; at most one row per (scope, key) exists in the whole table.
	//
	// OFFSET 0 keeps NOT EXISTS (elsewhere) a subplan run per key, an
	// index probe per partition. Without it the planner may turn it into
	// an anti-join, and it estimates "bucket <> current" to keep one row of
	// an analyzed older partition (which holds a single bucket value): for
	// a batch of some hundreds of keys it then picked a nested loop over a
	// scan of that partition, every key compared with every record (22 s
	// for 1,000 keys against 200,000 records), in the custom plans made for
	// the first runs on each connection (TestPartitionedBatchPlans).
	elsewhere := func(scope, key string) string {
		return `SELECT FROM ` + t + ` AS o WHERE o.scope = ` + scope + ` AND o.key = ` + key + ` AND o.bucket <> ` + cur + ` OFFSET 0`
	}
	// old deletes the key's row from another partition when it is one to
	// take over (takeoverCondition with fp for excluded.fingerprint).
	old := func(using, scope, key, fp, returning string) string {
		return `old AS (DELETE FROM ` + t + ` AS o ` + using + `WHERE o.scope = ` + scope + ` AND o.key = ` + key + ` AND o.bucket <> ` + cur + `
	AND ((o.state = 'completed' AND o.expires_at <= now())
		OR (o.state = 'in_progress' AND o.lease_expires_at <= now() AND o.fingerprint = ` + fp + `))
	RETURNING ` + returning + `)
`
	}
	takeover := `ON CONFLICT (scope, key, bucket) DO UPDATE SET `
	q.claim = `WITH ` + old("", "$1", "$2", "$3", "o.state, o.created_at") +
		`INSERT INTO ` + t + ` AS r (scope, key, bucket, state, fingerprint, created_at, lease_expires_at, expires_at)
SELECT $1, $2, ` + cur + `, 'in_progress', $3,
	coalesce((SELECT created_at FROM old WHERE state = 'in_progress'), now()),
	now() + $4 * interval '1 microsecond', now() + $4 * interval '1 microsecond'
WHERE EXISTS (SELECT FROM old) OR NOT EXISTS (` + elsewhere("$1", "$2") + `)
` + takeover + `
	state = 'in_progress', fingerprint = excluded.fingerprint, token = excluded.token,
	result = NULL, failed = false, tombstone = false,
	created_at = CASE WHEN r.state = 'in_progress' THEN r.created_at ELSE excluded.created_at END,
	lease_expires_at = excluded.lease_expires_at, completed_at = NULL, expires_at = excluded.expires_at
WHERE ` + takeoverCondition + `
RETURNING token, lease_expires_at, created_at < now()`

	one := `INSERT INTO ` + t + ` AS r (scope, key, bucket, state, fingerprint, token, created_at, completed_at, expires_at)
SELECT $1, $2, ` + cur + `, 'completed', $3, 0, now(), now(), now() + $4 * interval '1 microsecond'
`
	q.processOneNew = one + `WHERE NOT EXISTS (` + elsewhere("$1", "$2") + `)
ON CONFLICT (scope, key, bucket) DO NOTHING
RETURNING true`
	q.processOne = `WITH ` + old("", "$1", "$2", "$3", "o.key") + one +
		`WHERE EXISTS (SELECT FROM old) OR NOT EXISTS (` + elsewhere("$1", "$2") + `)
` + takeover + processSet + `
WHERE ` + takeoverCondition + `
RETURNING true`

	u := `u AS (SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[], $4::bigint[]) AS u(scope, key, fp, ret))`
	batch := `INSERT INTO ` + t + ` AS r (scope, key, bucket, state, fingerprint, token, created_at, completed_at, expires_at)
SELECT u.scope, u.key, ` + cur + `, 'completed', u.fp, 0, now(), now(), now() + u.ret * interval '1 microsecond'
FROM u
`
	q.processBatchNew = `WITH ` + u + `
` + batch + `WHERE NOT EXISTS (` + elsewhere("u.scope", "u.key") + `)
ON CONFLICT (scope, key, bucket) DO NOTHING
RETURNING r.scope, r.key`
	q.processBatch = `WITH ` + u + `,
` + old("USING u ", "u.scope", "u.key", "u.fp", "o.scope, o.key") + batch +
		`WHERE EXISTS (SELECT FROM old WHERE old.scope = u.scope AND old.key = u.key)
	OR NOT EXISTS (` + elsewhere("u.scope", "u.key") + `)
` + takeover + processSet + `
WHERE ` + takeoverCondition + `
RETURNING r.scope, r.key`

	// A ctid is unique only within one partition.
	q.purge = `DELETE FROM ` + t + ` WHERE (tableoid, ctid) = ANY(ARRAY(
	SELECT (tableoid, ctid) FROM ` + t + ` WHERE expires_at <= now() LIMIT $1 FOR UPDATE SKIP LOCKED))`
	return q
}

// sender is what a pooled connection and a transaction have in common for
// the store's writes.
type sender interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// writeRow runs a write that may create a record and returns its row. In
// the partitioned layout the bucket lock goes first, in the same round
// trip and the same transaction (a batch outside a transaction is one
// implicit transaction).
func (s *Store) writeRow(ctx context.Context, q sender, sql string, args ...any) pgx.Row {
	if s.q.lockShared == "" {
		return q.QueryRow(ctx, sql, args...)
	}
	b := &pgx.Batch{}
	b.Queue(s.q.lockShared, lockKey(s.schema))
	b.Queue(sql, args...)
	return &batchRow{br: q.SendBatch(ctx, b)}
}

// writeRows is writeRow for a statement of many rows. The caller closes
// the rows, then calls done.
func (s *Store) writeRows(ctx context.Context, q sender, sql string, args ...any) (rows pgx.Rows, done func() error, err error) {
	if s.q.lockShared == "" {
		rows, err := q.Query(ctx, sql, args...)
		return rows, func() error { return nil }, err
	}
	b := &pgx.Batch{}
	b.Queue(s.q.lockShared, lockKey(s.schema))
	b.Queue(sql, args...)
	br := q.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return nil, nil, err
	}
	rows, err = br.Query()
	if err != nil {
		_ = br.Close()
		return nil, nil, err
	}
	return rows, br.Close, nil
}

// batchRow is the second statement's row of a lock-then-write batch.
type batchRow struct{ br pgx.BatchResults }

func (r *batchRow) Scan(dest ...any) error {
	if _, err := r.br.Exec(); err != nil {
		_ = r.br.Close()
		return err
	}
	err := r.br.QueryRow().Scan(dest...)
	if cerr := r.br.Close(); cerr != nil && (err == nil || errors.Is(err, pgx.ErrNoRows)) {
		return cerr
	}
	return err
}

// PartitionOptions configure [Migrator.Partition]. A nil pointer means the
// defaults.
type PartitionOptions struct {
	// Interval is how long one partition takes the new records before
	// [Store.Maintain] moves the writes to the next one. Default 24h. A
	// partition is dropped once every record in it expired, so records
	// live in at most retention/Interval + 2 partitions.
	Interval time.Duration
}

// Partition converts the schema's idem_records to the time-partitioned
// layout, in one transaction under the migrations' lock: the existing table
// becomes partition 0 (its rows keep their keys and tokens, and it is
// dropped by [Store.Maintain] once they all expired), and new records go to
// partition 1. Then run the stores with Config.Partitioned and call
// [Store.Maintain] periodically (or `idem keys maintain`).
//
// The conversion rebuilds the primary key of the existing rows (the table
// is locked meanwhile), so convert an empty or small table, or see the
// package documentation for a large one. Stop the stores of the plain
// layout first: their inserts fail on the partitioned table. The schema
// must be migrated; converting twice is an error.
func (m *Migrator) Partition(ctx context.Context, opts *PartitionOptions) error {
	interval := defaultInterval
	if opts != nil && opts.Interval != 0 {
		interval = opts.Interval
	}
	if interval < time.Second {
		return fmt.Errorf("idempgx: partition: interval must be at least 1s, got %v", interval)
	}
	return m.step(ctx, func(ctx context.Context, tx pgx.Tx, current int) error {
		if current < 1 {
			return fmt.Errorf("idempgx: partition schema %s: %w: run `idem migrate up` first", m.schema, ErrNotMigrated)
		}
		kind, err := relkind(ctx, tx, m.schema)
		if err != nil {
			return err
		}
		if kind == 'p' {
			return fmt.Errorf("idempgx: partition schema %s: idem_records is already partitioned", m.schema)
		}
		t := m.table("idem_records")
		p0 := pgx.Identifier{partitionStem + "0"}.Sanitize()
		for _, stmt := range []string{
			// Left by an earlier partitioned layout that `migrate down` removed.
			`DROP TABLE IF EXISTS ` + m.table(bucketsTable),
			`ALTER TABLE ` + t + ` RENAME TO ` + p0,
			`ALTER TABLE ` + m.table(partitionStem+"0") + ` DROP CONSTRAINT idem_records_pkey`,
			`ALTER TABLE ` + m.table(partitionStem+"0") + ` ADD COLUMN bucket bigint NOT NULL DEFAULT 0`,
			`CREATE TABLE ` + t + ` (LIKE ` + m.table(partitionStem+"0") + ` INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
	PRIMARY KEY (scope, key, bucket)) PARTITION BY LIST (bucket)`,
			`ALTER TABLE ` + t + ` ALTER COLUMN bucket DROP DEFAULT`,
			`CREATE INDEX idem_records_part_expires_at_idx ON ` + t + ` (expires_at)`,
			// The leases of a partition, for Maintain's last look before a
			// drop (the transactional path writes none).
			`CREATE INDEX idem_records_part_leases_idx ON ` + t + ` (expires_at) WHERE state = 'in_progress'`,
			`ALTER TABLE ` + t + ` ATTACH PARTITION ` + m.table(partitionStem+"0") + ` FOR VALUES IN (0)`,
			`CREATE TABLE ` + m.table(partitionStem+"1") + ` PARTITION OF ` + t + ` FOR VALUES IN (1)`,
			`CREATE TABLE ` + m.table(bucketsTable) + ` (
	one         boolean     PRIMARY KEY DEFAULT true CHECK (one),
	cur         bigint      NOT NULL,
	interval_us bigint      NOT NULL CHECK (interval_us > 0),
	switched_at timestamptz NOT NULL DEFAULT now()
)`,
		} {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return fmt.Errorf("idempgx: partition schema %s: %w", m.schema, classify(err))
			}
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+m.table(bucketsTable)+` (cur, interval_us) VALUES (1, $1)`, micros(interval)); err != nil {
			return fmt.Errorf("idempgx: partition schema %s: %w", m.schema, classify(err))
		}
		return nil
	})
}

// relkind returns the kind of the schema's idem_records ('r' a table, 'p'
// a partitioned table), or 0 when there is none.
func relkind(ctx context.Context, q querier, schema string) (byte, error) {
	var kind *string
	err := q.QueryRow(ctx, `SELECT c.relkind::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname = 'idem_records'`, schema).Scan(&kind)
	if errors.Is(err, pgx.ErrNoRows) || err == nil && (kind == nil || *kind == "") {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("idempgx: look up idem_records in %s: %w", schema, classify(err))
	}
	return (*kind)[0], nil
}

// IsPartitioned reports whether schema's idem_records has the partitioned
// layout of [Migrator.Partition], for tools that open stores on schemas
// of either layout (set Config.Partitioned to the answer). A schema without
// idem_records is not partitioned.
func IsPartitioned(ctx context.Context, pool *pgxpool.Pool, schema string) (bool, error) {
	if schema == "" {
		schema = "public"
	}
	kind, err := relkind(ctx, pool, schema)
	return kind == 'p', err
}

// checkLayout verifies that Config.Partitioned matches the schema.
func (s *Store) checkLayout(ctx context.Context) error {
	kind, err := relkind(ctx, s.pool, s.schema)
	if err != nil || kind == 0 {
		return err
	}
	if partitioned := kind == 'p'; partitioned != s.cfg.Partitioned {
		if partitioned {
			return fmt.Errorf("%w: schema %s is partitioned (Migrator.Partition); set Config.Partitioned", ErrNotPartitioned, s.schema)
		}
		return fmt.Errorf("%w: Config.Partitioned is set but schema %s has the plain table; run Migrator.Partition (`idem keys maintain --partition`) first", ErrNotPartitioned, s.schema)
	}
	return nil
}

// PartitionInfo describes one partition of the partitioned layout.
type PartitionInfo struct {
	// Name is the partition's table, idem_records_p<Bucket>.
	Name   string
	Bucket int64
	// Current is the partition the writes go to.
	Current bool
}

// MaintainReport is what one [Store.Maintain] did.
type MaintainReport struct {
	// Current is the bucket the writes go to after the call.
	Current int64
	// Rotated is set when the call moved the writes to a new partition.
	Rotated bool
	// Dropped lists the partitions dropped: every record in them expired.
	Dropped []string
	// Kept lists the older partitions that still hold a live record, or
	// that were busy (a lock wait past LockTimeout); a later call retries.
	Kept []string
}

// MaintainOptions configure [Store.Maintain]. A nil pointer means the
// defaults.
type MaintainOptions struct {
	// LockTimeout bounds each wait for a lock: the rotation waits for the
	// writes of the old bucket in flight (and makes new writes wait behind
	// it, so keep it short), a drop for the catalog lock of the detach.
	// Default 2s; a wait that times out leaves things as they are for a
	// later call.
	LockTimeout time.Duration
	// Rotate moves the writes to a new partition even if the current one
	// is younger than its interval.
	Rotate bool
	// KeepExpired skips the drops: the call only creates and rotates.
	KeepExpired bool
}

// Maintain does the partitioned layout's housekeeping; call it every few
// minutes (it is cheap when there is nothing to do), from one or several
// processes. It moves the writes to a new partition once the current one
// took them for the interval given to [Migrator.Partition] (creating the
// next partition first, so writes never lack one), and drops every older
// partition whose records all expired: retention by dropping whole tables,
// which returns their space at once, instead of deleting rows. Drops do
// not stop the writes (DETACH PARTITION … CONCURRENTLY): a partition
// whose records all expired first loses its expired leases (as Purge
// would delete them), the only records that could come back to life, and
// is then detached and dropped. A partition that still holds a live record
// is passed over with one index probe.
//
// Purge still works in this layout (it deletes expired rows in place), and
// is not needed when Maintain runs.
func (s *Store) Maintain(ctx context.Context, opts *MaintainOptions) (MaintainReport, error) {
	if !s.cfg.Partitioned {
		return MaintainReport{}, fmt.Errorf("%w: maintain: Config.Partitioned is not set", ErrNotPartitioned)
	}
	o := MaintainOptions{LockTimeout: 2 * time.Second}
	if opts != nil {
		o.Rotate, o.KeepExpired = opts.Rotate, opts.KeepExpired
		if opts.LockTimeout > 0 {
			o.LockTimeout = opts.LockTimeout
		}
	}
	var (
		rep MaintainReport
		due bool
	)
	err := s.pool.QueryRow(ctx, `SELECT cur, now() >= switched_at + interval_us * interval '1 microsecond' FROM `+
		s.table(bucketsTable)).Scan(&rep.Current, &due)
	if err != nil {
		return rep, s.wrap("maintain", err)
	}
	if due || o.Rotate {
		cur, rotated, err := s.rotate(ctx, rep.Current, o.LockTimeout)
		if err != nil {
			return rep, err
		}
		rep.Current, rep.Rotated = cur, rotated
	}
	if o.KeepExpired {
		return rep, nil
	}
	parts, err := s.Partitions(ctx)
	if err != nil {
		return rep, err
	}
	// Partitions that an earlier call detached and did not drop (stopped
	// in between, or its detach completed as its context ended): marked
	// before their detach, so a partition detached by hand is left alone.
	rows, err := s.pool.Query(ctx, `SELECT c.relname FROM pg_class c
WHERE c.relnamespace = to_regnamespace($1) AND c.relkind = 'r' AND c.relname ~ '^idem_records_p[0-9]+$'
	AND obj_description(c.oid, 'pg_class') = $2 AND NOT EXISTS (SELECT FROM pg_inherits WHERE inhrelid = c.oid)`,
		pgx.Identifier{s.schema}.Sanitize(), detachMark)
	if err != nil {
		return rep, s.wrap("maintain: detached partitions", err)
	}
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return rep, s.wrap("maintain: detached partitions", err)
	}
	for _, name := range left {
		if _, err := s.pool.Exec(ctx, `DROP TABLE IF EXISTS `+s.table(name)); err != nil {
			return rep, s.wrap("maintain: drop "+name, err)
		}
		rep.Dropped = append(rep.Dropped, name)
	}
	for _, p := range parts {
		if p.Bucket >= rep.Current {
			continue
		}
		dropped, err := s.dropIfExpired(ctx, p, o.LockTimeout)
		if err != nil {
			return rep, err
		}
		if dropped {
			rep.Dropped = append(rep.Dropped, p.Name)
		} else {
			rep.Kept = append(rep.Kept, p.Name)
		}
	}
	if len(rep.Dropped) > 0 || rep.Rotated {
		s.cfg.Logger.InfoContext(ctx, "idempgx: maintained partitions", "schema", s.schema,
			"current", rep.Current, "rotated", rep.Rotated, "dropped", len(rep.Dropped), "kept", len(rep.Kept))
	}
	return rep, nil
}

func (s *Store) table(name string) string { return pgx.Identifier{s.schema, name}.Sanitize() }

// Partitions lists the partitions of the layout in bucket order.
func (s *Store) Partitions(ctx context.Context) ([]PartitionInfo, error) {
	if !s.cfg.Partitioned {
		return nil, fmt.Errorf("%w: partitions: Config.Partitioned is not set", ErrNotPartitioned)
	}
	var cur int64
	if err := s.pool.QueryRow(ctx, `SELECT cur FROM `+s.table(bucketsTable)).Scan(&cur); err != nil {
		return nil, s.wrap("partitions", err)
	}
	rows, err := s.pool.Query(ctx, `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = to_regclass($1)`, s.table("idem_records"))
	if err != nil {
		return nil, s.wrap("partitions", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, s.wrap("partitions", err)
	}
	var out []PartitionInfo
	for _, n := range names {
		m := partitionName.FindStringSubmatch(n)
		if m == nil {
			continue // not ours: left alone
		}
		b, err := strconv.ParseInt(m[1], 10, 64)
		if err != nil {
			continue
		}
		out = append(out, PartitionInfo{Name: n, Bucket: b, Current: b == cur})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Bucket < out[j].Bucket })
	return out, nil
}

// rotate creates partition from+1 if needed, then moves the writes to it
// unless another process already moved them past from. It returns the
// current bucket and whether this call moved it. A lock wait past timeout
// leaves the writes where they are (no error).
func (s *Store) rotate(ctx context.Context, from int64, timeout time.Duration) (int64, bool, error) {
	next := from + 1
	name := partitionStem + strconv.FormatInt(next, 10)
	// Created apart and attached: ATTACH PARTITION takes only a SHARE
	// UPDATE EXCLUSIVE lock on the parent, which writes do not wait for.
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", "idem-maintain:"+s.schema); err != nil {
			return err
		}
		var attached bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_inherits WHERE inhrelid = to_regclass($1))`, s.table(name)).Scan(&attached); err != nil {
			return err
		}
		if attached {
			return nil
		}
		for _, stmt := range []string{
			`CREATE TABLE IF NOT EXISTS ` + s.table(name) + ` (LIKE ` + s.table("idem_records") + ` INCLUDING DEFAULTS INCLUDING CONSTRAINTS)`,
			`ALTER TABLE ` + s.table("idem_records") + ` ATTACH PARTITION ` + s.table(name) + ` FOR VALUES IN (` + strconv.FormatInt(next, 10) + `)`,
		} {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return from, false, s.wrap("maintain: create partition "+name, err)
	}
	var cur int64
	moved := false
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT set_config('lock_timeout', $1, true)", strconv.FormatInt(timeout.Milliseconds(), 10)); err != nil {
			return err
		}
		// Waits for every write that read the current bucket to end; the
		// writes that come after read the new one.
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", lockKey(s.schema)); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `UPDATE `+s.table(bucketsTable)+` SET cur = $1, switched_at = now() WHERE cur = $2`, next, from)
		if err != nil {
			return err
		}
		moved = tag.RowsAffected() == 1
		return tx.QueryRow(ctx, `SELECT cur FROM `+s.table(bucketsTable)).Scan(&cur)
	})
	if isLockTimeout(err) {
		s.cfg.Logger.WarnContext(ctx, "idempgx: maintain: writes still in flight after the lock timeout; not rotated this time",
			"schema", s.schema, "timeout", timeout)
		return from, false, nil
	}
	if err != nil {
		return from, false, s.wrap("maintain: rotate", err)
	}
	return cur, moved, nil
}

// dropIfExpired drops partition p, an old one, if every record in it
// expired, without stopping the writes: no write inserts into an old
// partition, a completed record never comes back to life (Complete and
// Extend need a lease), and the expired leases, which could, are deleted
// first (as Purge would), so once p holds only expired completed records
// nothing can change in it but deletions, and it is detached CONCURRENTLY.
// A lock wait past timeout keeps it for a later call.
func (s *Store) dropIfExpired(ctx context.Context, p PartitionInfo, timeout time.Duration) (bool, error) {
	pt := s.table(p.Name)
	live := `SELECT EXISTS (SELECT FROM ` + pt + ` WHERE expires_at > now())
	OR EXISTS (SELECT FROM ` + pt + ` WHERE state = 'in_progress')`
	var (
		alive   bool
		pending bool
	)
	err := s.pool.QueryRow(ctx, `SELECT inhdetachpending FROM pg_inherits WHERE inhrelid = to_regclass($1)`, pt).Scan(&pending)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil // dropped meanwhile by another process
	}
	if err != nil {
		return false, s.wrap("maintain: check "+p.Name, err)
	}
	if !pending {
		// Only an index probe when the partition still holds live records.
		if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM `+pt+` WHERE expires_at > now())`).Scan(&alive); err != nil {
			return false, s.wrap("maintain: check "+p.Name, err)
		}
		if alive {
			return false, nil
		}
		if _, err := s.pool.Exec(ctx, `DELETE FROM `+pt+` WHERE state = 'in_progress' AND expires_at <= now()`); err != nil {
			return false, s.wrap("maintain: expired leases of "+p.Name, err)
		}
		// A lease extended just before that delete is live again: keep p.
		if err := s.pool.QueryRow(ctx, live).Scan(&alive); err != nil {
			return false, s.wrap("maintain: check "+p.Name, err)
		}
		if alive {
			return false, nil
		}
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return false, s.wrap("maintain: drop "+p.Name, err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT set_config('lock_timeout', $1, false)", strconv.FormatInt(timeout.Milliseconds(), 10)); err != nil {
		return false, s.wrap("maintain: drop "+p.Name, err)
	}
	defer func() {
		_, _ = conn.Exec(context.WithoutCancel(ctx), "RESET lock_timeout")
	}()
	// The mark lets a later call finish the drop should this one stop
	// after the detach.
	if _, err := conn.Exec(ctx, `COMMENT ON TABLE `+pt+` IS '`+detachMark+`'`); err != nil {
		if isLockTimeout(err) {
			return false, nil
		}
		return false, s.wrap("maintain: mark "+p.Name, err)
	}
	// CONCURRENTLY: the parent stays open to the writes; FINALIZE ends a
	// detach that an earlier call began and did not finish.
	detach := `ALTER TABLE ` + s.table("idem_records") + ` DETACH PARTITION ` + pt + ` CONCURRENTLY`
	if pending {
		detach = `ALTER TABLE ` + s.table("idem_records") + ` DETACH PARTITION ` + pt + ` FINALIZE`
	}
	if _, err := conn.Exec(ctx, detach); err != nil {
		if isLockTimeout(err) {
			return false, nil
		}
		// undefined_table: another Maintain detached p (or dropped it)
		// since the checks above; the drop below finishes its work, and
		// leaves no detached table behind should that one have stopped
		// before its drop.
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42P01" {
			return false, s.wrap("maintain: detach "+p.Name, err)
		}
	}
	// IF EXISTS: another Maintain may drop it too. Not cut short by ctx:
	// p is detached, and the drop of a table nothing uses is quick.
	if _, err := conn.Exec(context.WithoutCancel(ctx), `DROP TABLE IF EXISTS `+pt); err != nil {
		return false, s.wrap("maintain: drop "+p.Name, err)
	}
	return true, nil
}

// isLockTimeout reports PostgreSQL's lock_not_available (lock_timeout).
func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}
