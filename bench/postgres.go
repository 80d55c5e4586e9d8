package bench

import (
	"context"
	"errors"
	"fmt"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// BatchSize is the batch of every batched scenario.
const BatchSize = 100

// pgEnv is the PostgreSQL state the scenarios share: one pool and one
// schema for idem, the textbook and the ceiling tables, and a second pool
// whose search_path is River's own schema.
type pgEnv struct {
	pool     *pgxpool.Pool
	schema   string
	store    *idempgx.Store
	river    *river.Client[pgx.Tx]
	riverDB  *pgxpool.Pool
	accounts int // tables created so far
}

func (p *pgEnv) table(name string) string { return pgx.Identifier{p.schema, name}.Sanitize() }

func postgres(ctx context.Context, env *Env) (*pgEnv, error) {
	return sharedValue(env, "postgres", func() (*pgEnv, error) {
		cfg, err := pgxpool.ParseConfig(env.PostgresURL)
		if err != nil {
			return nil, err
		}
		cfg.MaxConns = 40
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, err
		}
		p := &pgEnv{pool: pool, schema: "idembench_" + env.Prefix}
		env.Cleanup(pool.Close)
		if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{p.schema}.Sanitize()); err != nil {
			return nil, err
		}
		env.Cleanup(func() {
			_, _ = pool.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{p.schema}.Sanitize()+" CASCADE")
		})
		m, err := idempgx.NewMigrator(pool, &idempgx.MigratorConfig{Schema: p.schema})
		if err != nil {
			return nil, err
		}
		if _, err := m.Up(ctx); err != nil {
			return nil, err
		}
		if p.store, err = idempgx.New(pool, &idempgx.Config{Schema: p.schema}); err != nil {
			return nil, err
		}
		for _, q := range []string{
			"CREATE TABLE " + p.table("processed") + " (id text PRIMARY KEY, processed_at timestamptz NOT NULL DEFAULT now())",
			"CREATE TABLE " + p.table("ceiling") + " (scope text NOT NULL, key text NOT NULL, PRIMARY KEY (scope, key))",
		} {
			if _, err := pool.Exec(ctx, q); err != nil {
				return nil, err
			}
		}
		if err := p.setUpRiver(ctx, env); err != nil {
			return nil, fmt.Errorf("river: %w", err)
		}
		return p, nil
	})
}

// setUpRiver migrates River into its own schema, reached through the
// search_path of a dedicated pool, as River's docs suggest.
func (p *pgEnv) setUpRiver(ctx context.Context, env *Env) error {
	schema := "idembench_river_" + env.Prefix
	if _, err := p.pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return err
	}
	env.Cleanup(func() {
		_, _ = p.pool.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	cfg, err := pgxpool.ParseConfig(env.PostgresURL)
	if err != nil {
		return err
	}
	cfg.MaxConns = 40
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	if p.riverDB, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return err
	}
	env.Cleanup(p.riverDB.Close)
	driver := riverpgxv5.New(p.riverDB)
	m, err := rivermigrate.New(driver, nil)
	if err != nil {
		return err
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return err
	}
	p.river, err = river.NewClient(driver, &river.Config{})
	return err
}

// ledger is the effect: a balance per consumer, credited once per distinct
// message. One account per consumer keeps the effect free of row
// contention, so that the numbers measure the dedupe, not the ledger.
type ledger struct {
	p        *pgEnv
	table    string
	expected int
}

func (p *pgEnv) newLedger(ctx context.Context) (*ledger, error) {
	p.accounts++
	l := &ledger{p: p, table: p.table(fmt.Sprintf("accounts_%d", p.accounts))}
	if _, err := p.pool.Exec(ctx, "CREATE TABLE "+l.table+" (id int PRIMARY KEY, balance bigint NOT NULL)"); err != nil {
		return nil, err
	}
	if _, err := p.pool.Exec(ctx, "INSERT INTO "+l.table+" SELECT g, 0 FROM generate_series(0, 63) g"); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *ledger) credit(ctx context.Context, tx pgx.Tx, worker, n int) error {
	_, err := tx.Exec(ctx, "UPDATE "+l.table+" SET balance = balance + $2 WHERE id = $1", worker, n)
	return err
}

// check verifies that the ledger holds exactly one credit per distinct
// message so far.
func (l *ledger) check(ctx context.Context, s Stream) error {
	l.expected += s.Distinct
	var total int64
	if err := l.p.pool.QueryRow(ctx, "SELECT coalesce(sum(balance), 0) FROM "+l.table).Scan(&total); err != nil {
		return err
	}
	if total != int64(l.expected) {
		return fmt.Errorf("ledger holds %d credits, want %d: not exactly once", total, l.expected)
	}
	return nil
}

func postgresScenarios(perMessage, batched int) []*Scenario {
	var out []*Scenario
	for _, c := range []int{1, 8, 32} {
		for _, d := range []int{0, 30} {
			row := func(name string, role Role, n int, note string, prep func(context.Context, *Env, *Scenario) (Run, error)) {
				out = append(out, &Scenario{Group: GroupPostgres, Name: name, Role: role, Concurrency: c, DupPercent: d,
					Messages: n, Note: note, Needs: NeedsPostgres, Prepare: prep})
			}
			row("raw INSERT … ON CONFLICT DO NOTHING ×100", RoleCeiling, batched, "no effect, no transaction", prepPGCeiling)
			row("textbook pgx tx per message", RoleTextbook, perMessage, "INSERT ON CONFLICT + UPDATE + COMMIT", prepPGTextbook)
			row("idem Process", RoleIdem, perMessage, "one message per call", prepPGProcess)
			row("idem ProcessBatch ×100", RoleIdem, batched, "", prepPGBatch)
			row("River InsertManyTx unique ×100", RolePeer, batched, "UniqueOpts ByArgs, same tx as the effect", prepRiver)
		}
	}
	return out
}

func prepPGCeiling(ctx context.Context, env *Env, s *Scenario) (Run, error) {
	return prepPGCeilingN(ctx, env, s, BatchSize)
}

// prepPGCeilingN is the ceiling for batches of size keys.
func prepPGCeilingN(ctx context.Context, env *Env, s *Scenario, size int) (Run, error) {
	p, err := postgres(ctx, env)
	if err != nil {
		return Run{}, err
	}
	q := "INSERT INTO " + p.table("ceiling") + " (scope, key) SELECT $1, unnest($2::text[]) ON CONFLICT DO NOTHING"
	// A scope of the row's own, about as long as idem's ("pg-batch"): the
	// row's ID (60 to 90 bytes) made every ceiling row and index entry
	// wider than idem's, and so the ceiling slower than it should be.
	scope := fmt.Sprintf("ceil-%d-c%d-d%d", size, s.Concurrency, s.DupPercent)
	var rows int64
	return Run{
		Exec: func(ctx context.Context, st Stream) error {
			return eachBatch(ctx, s.Concurrency, len(st.Keys), size, func(ctx context.Context, _, lo, hi int) error {
				_, err := p.pool.Exec(ctx, q, scope, sortedUnique(st.Keys[lo:hi]))
				return err
			})
		},
		After: func(ctx context.Context, st Stream) error {
			rows += int64(st.Distinct)
			var n int64
			if err := p.pool.QueryRow(ctx, "SELECT count(*) FROM "+p.table("ceiling")+" WHERE scope = $1", scope).Scan(&n); err != nil {
				return err
			}
			if n != rows {
				return fmt.Errorf("%d rows, want %d", n, rows)
			}
			return nil
		},
	}, nil
}

func prepPGTextbook(ctx context.Context, env *Env, s *Scenario) (Run, error) {
	p, err := postgres(ctx, env)
	if err != nil {
		return Run{}, err
	}
	l, err := p.newLedger(ctx)
	if err != nil {
		return Run{}, err
	}
	insert := "INSERT INTO " + p.table("processed") + " (id) VALUES ($1) ON CONFLICT DO NOTHING"
	return Run{
		Exec: func(ctx context.Context, st Stream) error {
			return eachMessage(ctx, s.Concurrency, len(st.Keys), func(ctx context.Context, w, i int) error {
				return pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
					tag, err := tx.Exec(ctx, insert, st.Keys[i])
					if err != nil || tag.RowsAffected() == 0 {
						return err
					}
					return l.credit(ctx, tx, w, 1)
				})
			})
		},
		After: l.check,
	}, nil
}

func prepPGProcess(ctx context.Context, env *Env, s *Scenario) (Run, error) {
	p, err := postgres(ctx, env)
	if err != nil {
		return Run{}, err
	}
	l, err := p.newLedger(ctx)
	if err != nil {
		return Run{}, err
	}
	var msgs []idem.Message
	return Run{
		Before: func(_ context.Context, st Stream) error { msgs = st.Messages("pg-process"); return nil },
		Exec: func(ctx context.Context, st Stream) error {
			return eachMessage(ctx, s.Concurrency, len(msgs), func(ctx context.Context, w, i int) error {
				_, err := p.store.Process(ctx, msgs[i], func(ctx context.Context, tx pgx.Tx) error {
					return l.credit(ctx, tx, w, 1)
				})
				return err
			})
		},
		After: l.check,
	}, nil
}

func prepPGBatch(ctx context.Context, env *Env, s *Scenario) (Run, error) {
	return prepPGBatchN(ctx, env, s, BatchSize)
}

// prepPGBatchN is idem's ProcessBatch for batches of size messages.
func prepPGBatchN(ctx context.Context, env *Env, s *Scenario, size int) (Run, error) {
	p, err := postgres(ctx, env)
	if err != nil {
		return Run{}, err
	}
	l, err := p.newLedger(ctx)
	if err != nil {
		return Run{}, err
	}
	var msgs []idem.Message
	return Run{
		Before: func(_ context.Context, st Stream) error { msgs = st.Messages("pg-batch"); return nil },
		Exec: func(ctx context.Context, st Stream) error {
			return eachBatch(ctx, s.Concurrency, len(msgs), size, func(ctx context.Context, w, lo, hi int) error {
				_, err := p.store.ProcessBatch(ctx, msgs[lo:hi], func(ctx context.Context, tx pgx.Tx, fresh []int) error {
					return l.credit(ctx, tx, w, len(fresh))
				})
				return err
			})
		},
		After: l.check,
	}, nil
}

// ledgerArgs is the River job of the peer scenario; ByArgs uniqueness makes
// its key the dedupe key.
type ledgerArgs struct {
	Key string `json:"key"`
}

func (ledgerArgs) Kind() string { return "idembench_ledger" }

func prepRiver(ctx context.Context, env *Env, s *Scenario) (Run, error) {
	p, err := postgres(ctx, env)
	if err != nil {
		return Run{}, err
	}
	l, err := p.newLedger(ctx)
	if err != nil {
		return Run{}, err
	}
	opts := &river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}
	batch := func(ctx context.Context, w int, keys []string) error {
		// River's unique insert is an ON CONFLICT DO UPDATE, which refuses
		// one key twice in a statement: a River user drops in-batch repeats
		// first, and so do we (they count as duplicates).
		keys = sortedUnique(keys)
		params := make([]river.InsertManyParams, len(keys))
		for i, k := range keys {
			params[i] = river.InsertManyParams{Args: ledgerArgs{Key: k}, InsertOpts: opts}
		}
		return pgx.BeginFunc(ctx, p.riverDB, func(tx pgx.Tx) error {
			res, err := p.river.InsertManyTx(ctx, tx, params)
			if err != nil {
				return err
			}
			fresh := 0
			for _, r := range res {
				if !r.UniqueSkippedAsDuplicate {
					fresh++
				}
			}
			return l.credit(ctx, tx, w, fresh)
		})
	}
	return Run{
		Exec: func(ctx context.Context, st Stream) error {
			return eachBatch(ctx, s.Concurrency, len(st.Keys), BatchSize, func(ctx context.Context, w, lo, hi int) error {
				for {
					err := batch(ctx, w, st.Keys[lo:hi])
					if !isDeadlock(err) {
						return err
					}
				}
			})
		},
		After: l.check,
	}, nil
}

// isDeadlock reports PostgreSQL's deadlock_detected, after which the
// transaction simply runs again.
func isDeadlock(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "40P01"
}
