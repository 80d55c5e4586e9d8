package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// GroupRetention measures idem's claims (ProcessBatch ×100 dedupe records,
// 8 consumers) while retention runs beside them, on the plain table
// (DELETE purge) and on the partitioned layout (whole partitions dropped),
// each next to the same layout without retention work. The ceiling is the
// partitioned layout with no maintenance, so "vs ceiling" of the
// maintained row is the target: ≥ 90 %.
const GroupRetention = "PostgreSQL: claims during retention"

// Row names of GroupRetention.
const (
	RetentionPartNone  = "partitioned, no retention running"
	RetentionPartDrop  = "partitioned, Maintain drops expired partitions"
	RetentionPlainNone = "plain table, no retention running"
	RetentionPlainPurg = "plain table, DELETE purge running"
)

// RetentionRowsEnv overrides how many expired rows each table of the
// group starts with, and how many the drop has to retire each run
// (default: 50 times the batched size, 1M in the full report). The 50M variant is long: IDEM_BENCH_RETENTION_ROWS=50000000.
const RetentionRowsEnv = "IDEM_BENCH_RETENTION_ROWS"

func retentionScenarios(batched int) []*Scenario {
	rows := 50 * batched
	if v, err := strconv.Atoi(os.Getenv(RetentionRowsEnv)); err == nil && v > 0 {
		rows = v
	}
	note := func(s string, partitioned, retire bool) string {
		switch {
		case retire && partitioned:
			return fmt.Sprintf("%s; retires %s expired rows a run", s, short1k(rows))
		case retire:
			return fmt.Sprintf("%s; the table starts with %s expired rows, each run goes on with what the last left", s, short1k(rows))
		}
		return fmt.Sprintf("%s; the table holds %s expired rows", s, short1k(rows))
	}
	var out []*Scenario
	row := func(name string, role Role, n string, partitioned, retire bool) {
		out = append(out, &Scenario{Group: GroupRetention, Name: name, Role: role, Concurrency: 8, DupPercent: 0,
			Messages: 5 * batched, Note: note(n, partitioned, retire), Needs: NeedsPostgres,
			Prepare: func(ctx context.Context, env *Env, s *Scenario) (Run, error) {
				return prepRetention(ctx, env, s, rows, partitioned, retire)
			}})
	}
	row(RetentionPartNone, RoleCeiling, "the reference", true, false)
	row(RetentionPartDrop, RoleIdem, "rotation and DROP of whole partitions", true, true)
	row(RetentionPlainNone, RolePeer, "today's default layout", false, false)
	row(RetentionPlainPurg, RolePeer, "Store.Purge: DELETE … LIMIT 1000 in a loop", false, true)
	return out
}

func short1k(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return strconv.Itoa(n)
}

// prepRetention gives the row a schema of its own holding rows expired
// records, written as a real table would hold them (the store's own
// migrations and indexes; created_at spread over a day, each record
// expired a day after it was created) but filled in bulk: the rows go into
// a table without indexes, by parallel INSERT … SELECT generate_series, and
// the indexes are built afterwards, side by side. In the partitioned layout
// that table then becomes a partition the writes just left, as a day of
// traffic would be (attached with its indexes, and a CHECK that spares the
// attach its scan).
//
// The row with the drop needs a new partition of rows before each run (its
// retention retires all of them); the DELETE purge retires only part of
// its table in a run, so the next run goes on with what is left (topped up
// to rows when less than half is left); the rows without retention keep
// theirs. With IDEM_BENCH_VERBOSE each run prints how many expired rows
// the table held, how many the retention retired and the table's size
// before and after.
func prepRetention(ctx context.Context, env *Env, s *Scenario, rows int, partitioned, retire bool) (Run, error) {
	p, err := postgres(ctx, env)
	if err != nil {
		return Run{}, err
	}
	p.accounts++
	schema := fmt.Sprintf("%s_ret%d", p.schema, p.accounts)
	env.Cleanup(func() {
		_, _ = p.pool.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	m, err := idempgx.NewMigrator(p.pool, &idempgx.MigratorConfig{Schema: schema})
	if err != nil {
		return Run{}, err
	}
	if _, err := m.Up(ctx); err != nil {
		return Run{}, err
	}
	if partitioned {
		if err := m.Partition(ctx, &idempgx.PartitionOptions{Interval: time.Hour}); err != nil {
			return Run{}, err
		}
	}
	store, err := idempgx.New(p.pool, &idempgx.Config{Schema: schema, Partitioned: partitioned})
	if err != nil {
		return Run{}, err
	}
	verbose := os.Getenv("IDEM_BENCH_VERBOSE") != ""
	t := &retTable{pool: p.pool, schema: schema, partitioned: partitioned, filled: map[string]int64{}, verbose: verbose}
	if err := t.fill(ctx, rows); err != nil {
		return Run{}, fmt.Errorf("fill: %w", err)
	}
	var (
		msgs   []idem.Message
		live   int64 // records the runs claimed
		before retSize
		runs   int
	)
	filled := true // by Prepare, for the first run
	return Run{
		Before: func(ctx context.Context, st Stream) error {
			msgs = st.Messages("ret")
			if retire && !filled {
				if partitioned {
					if err := t.fill(ctx, rows); err != nil {
						return err
					}
				} else if t.expired < int64(rows)/2 {
					if err := t.topUp(ctx, int64(rows)-t.expired); err != nil {
						return err
					}
				}
			}
			if verbose {
				var err error
				if before, err = t.size(ctx); err != nil {
					return err
				}
			}
			return nil
		},
		// Rate, not Exec: the clock stops when the last claim returned,
		// before the retention beside it is stopped and waited for (a
		// DROP of a 2 GB partition may still be finishing: that is not
		// claim time).
		Rate: func(ctx context.Context, st Stream) (float64, error) {
			filled = false
			start := time.Now()
			var (
				wg     sync.WaitGroup
				retErr error
				took   time.Duration
				res    retired
			)
			retCtx, stop := context.WithCancel(ctx)
			defer stop()
			if retire {
				wg.Go(func() {
					start := time.Now()
					res, retErr = retireLoop(retCtx, store, partitioned)
					took = time.Since(start)
				})
			}
			err := eachBatch(ctx, s.Concurrency, len(msgs), BatchSize, func(ctx context.Context, _, lo, hi int) error {
				_, err := store.ProcessBatch(ctx, msgs[lo:hi], func(context.Context, pgx.Tx, []int) error { return nil })
				return err
			})
			rate := float64(len(st.Keys)) / time.Since(start).Seconds()
			stop()
			wg.Wait()
			held := t.expired
			// A filled partition is retired once it left the table: the
			// Maintain that the run's end stopped may have detached (and
			// dropped) it without reporting so.
			rowsRetired := res.rows
			var orphans []string
			for name, n := range t.filled {
				attached, exists, aerr := t.attached(context.WithoutCancel(ctx), name)
				if aerr != nil {
					err = errors.Join(err, aerr)
					break
				}
				if !attached {
					rowsRetired += n
					delete(t.filled, name)
					if exists {
						orphans = append(orphans, name)
					}
				}
			}
			t.expired -= rowsRetired
			runs++
			if verbose {
				after, serr := t.size(ctx)
				what := "no retention"
				if retire {
					what = fmt.Sprintf("retention ran %v beside the claims and retired %d expired rows", took.Round(time.Millisecond), rowsRetired)
					if partitioned {
						what += fmt.Sprintf(" (Maintain reported %d partitions dropped", len(res.dropped))
						if len(orphans) > 0 {
							what += fmt.Sprintf("; detached and NOT dropped: %v", orphans)
						}
						what += ")"
					}
				}
				fmt.Fprintf(os.Stderr, "%s: run %d: %.0f claims/s; the table held %d expired rows and %d live; %s; size before %s, after %s\n",
					s.Name, runs, rate, held, live, what, before, after)
				err = errors.Join(err, serr)
			}
			live += int64(st.Distinct)
			return rate, errors.Join(err, retErr)
		},
		After: func(ctx context.Context, st Stream) error {
			var n int
			if err := p.pool.QueryRow(ctx, "SELECT count(*) FROM "+t.table()+" WHERE scope = 'ret' AND key = ANY($1)", st.Keys).Scan(&n); err != nil {
				return err
			}
			if n != st.Distinct {
				return fmt.Errorf("%d records of the run, want %d", n, st.Distinct)
			}
			return nil
		},
	}, nil
}

// retFillWorkers is how many connections write a bulk fill side by side.
const retFillWorkers = 4

// retTable is the idem_records of one row of GroupRetention.
type retTable struct {
	pool        *pgxpool.Pool
	schema      string
	partitioned bool
	fills       int
	expired     int64            // expired records the table holds
	filled      map[string]int64 // partitioned: rows put in each partition
	bucket      int64            // partitioned: the bucket of the first fill, reused by the refills
	verbose     bool             // print each fill's time
}

func (t *retTable) table() string { return pgx.Identifier{t.schema, "idem_records"}.Sanitize() }

// expiredRows is the SELECT of fill number fill's records lo..hi of n:
// created over the day before yesterday, completed at once, expired a day
// later, so all of them before now.
func expiredRows(fill, lo, hi, n int64, bucket string) string {
	return fmt.Sprintf(`SELECT 'old', 'f%d-' || g, 'completed', sha256(int8send(g)), x.t, x.t, x.t + interval '1 day'%s
FROM generate_series(%d, %d) g, LATERAL (SELECT now() - interval '2 days' + g * (interval '1 day' / %d)) AS x(t)`, fill, bucket, lo, hi, n)
}

const expiredCols = `scope, key, state, fingerprint, created_at, completed_at, expires_at`

// insert writes n expired records into dst (a table without indexes, or
// the plain table for a top-up) from retFillWorkers connections.
func (t *retTable) insert(ctx context.Context, dst string, n int64, bucket string) error {
	t.fills++
	cols := expiredCols
	if bucket != "" {
		cols += ", bucket"
		bucket = ", " + bucket
	}
	per := (n + retFillWorkers - 1) / retFillWorkers
	stmts := make([]string, 0, retFillWorkers)
	for lo := int64(1); lo <= n; lo += per {
		stmts = append(stmts, `INSERT INTO `+dst+` (`+cols+`) `+expiredRows(int64(t.fills), lo, min(lo+per-1, n), n, bucket))
	}
	return t.parallel(ctx, stmts)
}

// parallel runs stmts side by side, each on a connection of its own with
// room for an index build.
func (t *retTable) parallel(ctx context.Context, stmts []string) error {
	errs := make([]error, len(stmts))
	var wg sync.WaitGroup
	for i, stmt := range stmts {
		wg.Go(func() {
			errs[i] = pgx.BeginFunc(ctx, t.pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, "SET LOCAL maintenance_work_mem = '256MB'"); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, stmt)
				return err
			})
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (t *retTable) exec(ctx context.Context, stmts ...string) error {
	for _, stmt := range stmts {
		if _, err := t.pool.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("%s: %w", stmt, err)
		}
	}
	return nil
}

// fill adds n expired records: to the plain table while it is empty (its
// indexes dropped and built again after, under the migration's names), or
// as a new partition that the writes then leave.
func (t *retTable) fill(ctx context.Context, n int) error {
	start := time.Now()
	err := t.fillRows(ctx, n)
	if err == nil && t.verbose {
		took := time.Since(start)
		fmt.Fprintf(os.Stderr, "%s: filled %d expired rows in %v (%.0f rows/s, indexes included)\n", t.schema, n, took.Round(time.Millisecond), float64(n)/took.Seconds())
	}
	return err
}

func (t *retTable) fillRows(ctx context.Context, n int) error {
	tbl := t.table()
	if !t.partitioned {
		if t.expired > 0 || t.fills > 0 {
			return t.topUp(ctx, int64(n))
		}
		if err := t.exec(ctx, `ALTER TABLE `+tbl+` DROP CONSTRAINT idem_records_pkey`,
			`DROP INDEX `+pgx.Identifier{t.schema, "idem_records_expires_at_idx"}.Sanitize()); err != nil {
			return err
		}
		if err := t.insert(ctx, tbl, int64(n), ""); err != nil {
			return err
		}
		if err := t.parallel(ctx, []string{
			`CREATE UNIQUE INDEX idem_records_pkey ON ` + tbl + ` (scope, key)`,
			`CREATE INDEX idem_records_expires_at_idx ON ` + tbl + ` (expires_at)`,
		}); err != nil {
			return err
		}
		if err := t.exec(ctx, `ALTER TABLE `+tbl+` ADD CONSTRAINT idem_records_pkey PRIMARY KEY USING INDEX idem_records_pkey`,
			`ANALYZE `+tbl); err != nil {
			return err
		}
		t.expired += int64(n)
		return nil
	}
	// The partition of expired rows, made here with its rows and indexes
	// and attached (its CHECK spares the attach its scan). The first fill
	// makes the next partition and rotates the writes past it, as a day of
	// traffic would leave it. A refill (the drop row, before each run) puts
	// it back in the bucket of the first, below the current one, once the
	// retention retired that: rotating again would leave the partition the
	// writes just left, with the last runs' records, in the table, one more
	// each run, and each one more probe per claim than the row without
	// retention has (whose partitions do not change).
	var cur int64
	if err := t.pool.QueryRow(ctx, `SELECT cur FROM `+pgx.Identifier{t.schema, "idem_record_buckets"}.Sanitize()).Scan(&cur); err != nil {
		return err
	}
	bucket, rotate := cur+1, true
	if t.bucket > 0 {
		_, exists, err := t.attached(ctx, partitionOf(t.bucket))
		if err != nil {
			return err
		}
		// Still there (the last drop did not finish): a new bucket.
		if !exists {
			bucket, rotate = t.bucket, false
		}
	}
	name := partitionOf(bucket)
	part := pgx.Identifier{t.schema, name}.Sanitize()
	check := pgx.Identifier{name + "_fill"}.Sanitize()
	if err := t.exec(ctx, `CREATE TABLE `+part+` (LIKE `+tbl+` INCLUDING DEFAULTS INCLUDING CONSTRAINTS)`,
		fmt.Sprintf(`ALTER TABLE %s ADD CONSTRAINT %s CHECK (bucket = %d)`, part, check, bucket)); err != nil {
		return err
	}
	if err := t.insert(ctx, part, int64(n), strconv.FormatInt(bucket, 10)); err != nil {
		return err
	}
	// The same indexes as the partitioned parent's, which the attach then
	// takes as its own (partition.go: the primary key and two on expires_at).
	// Named as the attach would name them.
	if err := t.parallel(ctx, []string{
		`CREATE UNIQUE INDEX ` + pgx.Identifier{name + "_pkey"}.Sanitize() + ` ON ` + part + ` (scope, key, bucket)`,
		`CREATE INDEX ` + pgx.Identifier{name + "_expires_at_idx"}.Sanitize() + ` ON ` + part + ` (expires_at)`,
		`CREATE INDEX ` + pgx.Identifier{name + "_expires_at_idx1"}.Sanitize() + ` ON ` + part + ` (expires_at) WHERE state = 'in_progress'`,
	}); err != nil {
		return err
	}
	if err := t.exec(ctx, `ALTER TABLE `+part+` ADD PRIMARY KEY USING INDEX `+pgx.Identifier{name + "_pkey"}.Sanitize(),
		`ANALYZE `+part); err != nil {
		return err
	}
	if rotate {
		// The rotation attaches it and moves the writes to it; a second
		// one leaves it with expired rows only.
		store, err := idempgx.New(t.pool, &idempgx.Config{Schema: t.schema, Partitioned: true})
		if err != nil {
			return err
		}
		for range 2 {
			if _, err := store.Maintain(ctx, &idempgx.MaintainOptions{Rotate: true, KeepExpired: true}); err != nil {
				return err
			}
		}
		if t.bucket == 0 {
			t.bucket = bucket
		}
		// The rotations left empty partitions behind (and the conversion
		// its first): every claim probes each partition, so a row that
		// kept them would probe two more than the drop row does once its
		// retention ran. Gone, every partitioned row starts its runs with
		// two: the current one and the filled one.
		if err := t.dropEmpty(ctx, name); err != nil {
			return err
		}
	} else if err := t.exec(ctx, fmt.Sprintf(`ALTER TABLE %s ATTACH PARTITION %s FOR VALUES IN (%d)`, tbl, part, bucket)); err != nil {
		return err
	}
	attached, _, err := t.attached(ctx, name)
	if err != nil {
		return err
	}
	if !attached {
		return fmt.Errorf("%s was not attached", name)
	}
	if err := t.exec(ctx, `ALTER TABLE `+part+` DROP CONSTRAINT `+check, `ANALYZE `+tbl); err != nil {
		return err
	}
	t.filled[name] = int64(n)
	t.expired += int64(n)
	return nil
}

// dropEmpty detaches and drops every empty partition of the table but
// keep and the current bucket's.
func (t *retTable) dropEmpty(ctx context.Context, keep string) error {
	var cur int64
	if err := t.pool.QueryRow(ctx, `SELECT cur FROM `+pgx.Identifier{t.schema, "idem_record_buckets"}.Sanitize()).Scan(&cur); err != nil {
		return err
	}
	rows, err := t.pool.Query(ctx, `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = to_regclass($1) AND c.relname <> $2 AND c.relname <> $3`, t.table(), keep, partitionOf(cur))
	if err != nil {
		return err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for _, name := range names {
		part := pgx.Identifier{t.schema, name}.Sanitize()
		var empty bool
		if err := t.pool.QueryRow(ctx, `SELECT NOT EXISTS (SELECT FROM `+part+`)`).Scan(&empty); err != nil {
			return err
		}
		if empty {
			if err := t.exec(ctx, `ALTER TABLE `+t.table()+` DETACH PARTITION `+part, `DROP TABLE `+part); err != nil {
				return err
			}
		}
	}
	return nil
}

func partitionOf(bucket int64) string { return "idem_records_p" + strconv.FormatInt(bucket, 10) }

// attached reports whether partition name is attached to the table, and
// whether it exists at all.
func (t *retTable) attached(ctx context.Context, name string) (attached, exists bool, err error) {
	err = t.pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_inherits WHERE inhrelid = to_regclass($1)), to_regclass($1) IS NOT NULL`,
		pgx.Identifier{t.schema, name}.Sanitize()).Scan(&attached, &exists)
	return attached, exists, err
}

// topUp adds n expired records to the plain table, indexes and all.
func (t *retTable) topUp(ctx context.Context, n int64) error {
	if err := t.insert(ctx, t.table(), n, ""); err != nil {
		return err
	}
	t.expired += n
	return t.exec(ctx, `ANALYZE `+t.table())
}

// retSize is the size of a row's idem_records, all partitions together,
// and how many partitions it has (0: the plain table).
type retSize struct{ heap, indexes, parts int64 }

func (s retSize) String() string {
	out := fmt.Sprintf("%s (heap %s + indexes %s)", mib(s.heap+s.indexes), mib(s.heap), mib(s.indexes))
	if s.parts > 0 {
		out += fmt.Sprintf(" in %d partitions", s.parts)
	}
	return out
}

func mib(n int64) string { return fmt.Sprintf("%.0f MiB", float64(n)/(1<<20)) }

func (t *retTable) size(ctx context.Context) (retSize, error) {
	var s retSize
	q := `SELECT pg_table_size(to_regclass($1)), pg_indexes_size(to_regclass($1)), 0`
	if t.partitioned {
		q = `SELECT coalesce(sum(pg_table_size(relid)), 0)::bigint, coalesce(sum(pg_indexes_size(relid)), 0)::bigint, count(*)
FROM pg_partition_tree(to_regclass($1)) WHERE isleaf`
	}
	err := t.pool.QueryRow(ctx, q, t.table()).Scan(&s.heap, &s.indexes, &s.parts)
	return s, err
}

// retired is what retireLoop retired: rows deleted by Purge, partitions
// dropped by Maintain.
type retired struct {
	rows    int64
	dropped []string
}

// retireLoop runs the retention until ctx ends and returns what it
// retired: Purge on the plain table (DELETE batches of 1,000 until none is
// left, again every 100 ms); Maintain on the partitioned layout (which
// drops the partition of expired rows that fill left), every 100 ms.
func retireLoop(ctx context.Context, store *idempgx.Store, partitioned bool) (retired, error) {
	var r retired
	for {
		var err error
		if partitioned {
			var rep idempgx.MaintainReport
			rep, err = store.Maintain(ctx, nil)
			r.dropped = append(r.dropped, rep.Dropped...)
		} else {
			var n int64
			n, err = store.Purge(ctx, 0)
			r.rows += n
		}
		if ctx.Err() != nil {
			return r, nil // stopped with the run, possibly mid-statement
		}
		if err != nil {
			return r, err
		}
		select {
		case <-ctx.Done():
			return r, nil
		case <-time.After(100 * time.Millisecond):
		}
	}
}
