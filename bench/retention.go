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

// RetentionRowsEnv overrides how many expired rows each run of a
// retention row has to retire (default: 50 times the batched size, 1M in
// the full report). The 50M variant is long: IDEM_BENCH_RETENTION_ROWS=50000000.
const RetentionRowsEnv = "IDEM_BENCH_RETENTION_ROWS"

func retentionScenarios(batched int) []*Scenario {
	rows := 50 * batched
	if v, err := strconv.Atoi(os.Getenv(RetentionRowsEnv)); err == nil && v > 0 {
		rows = v
	}
	note := func(s string, retire bool) string {
		if retire {
			return fmt.Sprintf("%s; retires %s expired rows a run", s, short1k(rows))
		}
		return fmt.Sprintf("%s; the table holds %s expired rows", s, short1k(rows))
	}
	var out []*Scenario
	row := func(name string, role Role, n string, partitioned, retire bool) {
		out = append(out, &Scenario{Group: GroupRetention, Name: name, Role: role, Concurrency: 8, DupPercent: 0,
			Messages: 5 * batched, Note: note(n, retire), Needs: NeedsPostgres,
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
// records; before each run it adds rows more, in an old partition (or the
// plain table), so that the retention running beside the timed claims has
// that much to retire. The rows without retention keep theirs.
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
	table := pgx.Identifier{schema, "idem_records"}.Sanitize()
	fills := 0
	// fill adds rows expired records: in the partitioned layout into a
	// partition the writes just left, as a day of traffic would be.
	fill := func(ctx context.Context) error {
		fills++
		bucket, col := "", ""
		if partitioned {
			rep, err := store.Maintain(ctx, &idempgx.MaintainOptions{Rotate: true, KeepExpired: true})
			if err != nil {
				return err
			}
			bucket, col = fmt.Sprintf(", %d", rep.Current-1), ", bucket"
			if _, err := store.Maintain(ctx, &idempgx.MaintainOptions{Rotate: true, KeepExpired: true}); err != nil {
				return err
			}
		}
		_, err := p.pool.Exec(ctx, `INSERT INTO `+table+` (scope, key, state, fingerprint, created_at, completed_at, expires_at`+col+`)
SELECT 'old', $1 || g, 'completed', sha256(g::text::bytea), now() - interval '2 days', now() - interval '2 days', now() - interval '1 day'`+bucket+`
FROM generate_series(1, $2) g`, fmt.Sprintf("f%d-", fills), rows)
		if err == nil {
			_, err = p.pool.Exec(ctx, "ANALYZE "+table)
		}
		return err
	}
	if err := fill(ctx); err != nil {
		return Run{}, fmt.Errorf("fill: %w", err)
	}
	var msgs []idem.Message
	filled := true // by Prepare, for the first run
	return Run{
		Before: func(ctx context.Context, st Stream) error {
			msgs = st.Messages("ret")
			if !retire || filled {
				return nil
			}
			return fill(ctx)
		},
		Exec: func(ctx context.Context, st Stream) error {
			filled = false
			var (
				wg      sync.WaitGroup
				retErr  error
				retired time.Duration
				count   int64
			)
			retCtx, stop := context.WithCancel(ctx)
			defer stop()
			if retire {
				wg.Go(func() {
					start := time.Now()
					count, retErr = retireLoop(retCtx, store, partitioned)
					retired = time.Since(start)
				})
			}
			err := eachBatch(ctx, s.Concurrency, len(msgs), BatchSize, func(ctx context.Context, _, lo, hi int) error {
				_, err := store.ProcessBatch(ctx, msgs[lo:hi], func(context.Context, pgx.Tx, []int) error { return nil })
				return err
			})
			stop()
			wg.Wait()
			if retire && os.Getenv("IDEM_BENCH_VERBOSE") != "" {
				unit := "rows"
				if partitioned {
					unit = "partitions"
				}
				fmt.Fprintf(os.Stderr, "%s: retention ran %v beside the claims and retired %d %s\n", s.Name, retired.Round(time.Millisecond), count, unit)
			}
			return errors.Join(err, retErr)
		},
		After: func(ctx context.Context, st Stream) error {
			var n int
			if err := p.pool.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE scope = 'ret' AND key = ANY($1)", st.Keys).Scan(&n); err != nil {
				return err
			}
			if n != st.Distinct {
				return fmt.Errorf("%d records of the run, want %d", n, st.Distinct)
			}
			return nil
		},
	}, nil
}

// retireLoop runs the retention until ctx ends and returns how much it
// retired: Purge on the plain table (DELETE batches of 1,000 until none is
// left, again every 100 ms), rows; Maintain on the partitioned layout
// (which drops the partition of expired rows that fill left), every
// 100 ms, partitions.
func retireLoop(ctx context.Context, store *idempgx.Store, partitioned bool) (int64, error) {
	var retired int64
	for {
		var err error
		if partitioned {
			var rep idempgx.MaintainReport
			rep, err = store.Maintain(ctx, nil)
			retired += int64(len(rep.Dropped))
		} else {
			var n int64
			n, err = store.Purge(ctx, 0)
			retired += n
		}
		if ctx.Err() != nil {
			return retired, nil // stopped with the run, possibly mid-statement
		}
		if err != nil {
			return retired, err
		}
		select {
		case <-ctx.Done():
			return retired, nil
		case <-time.After(100 * time.Millisecond):
		}
	}
}
