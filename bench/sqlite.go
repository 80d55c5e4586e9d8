package bench

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idemsqlite"
)

// sqliteEnv is the embedded store the SQLite, HTTP and consumer scenarios
// share, plus a plain database (same driver and pragmas) for the textbook
// and ceiling rows.
type sqliteEnv struct {
	store    *idemsqlite.Store
	plain    *sql.DB
	accounts int
}

func sqliteStores(ctx context.Context, env *Env) (*sqliteEnv, error) {
	return sharedValue(env, "sqlite", func() (*sqliteEnv, error) {
		s, err := idemsqlite.Open(ctx, filepath.Join(env.Dir, "idem.db"), &idemsqlite.Config{AutoMigrate: true})
		if err != nil {
			return nil, err
		}
		env.Cleanup(func() { _ = s.Close() })
		plain, err := idemsqlite.OpenDB(ctx, filepath.Join(env.Dir, "plain.db"))
		if err != nil {
			return nil, err
		}
		env.Cleanup(func() { _ = plain.Close() })
		// One writer connection is how careful hand-written SQLite code
		// avoids SQLITE_BUSY storms under concurrency.
		plain.SetMaxOpenConns(1)
		for _, q := range []string{
			"CREATE TABLE processed (id TEXT PRIMARY KEY)",
			"CREATE TABLE ceiling (key TEXT PRIMARY KEY)",
		} {
			if _, err := plain.ExecContext(ctx, q); err != nil {
				return nil, err
			}
		}
		return &sqliteEnv{store: s, plain: plain}, nil
	})
}

// sqliteLedger is the SQLite twin of ledger.
type sqliteLedger struct {
	db       *sql.DB
	table    string
	expected int
}

func (e *sqliteEnv) newLedger(ctx context.Context, db *sql.DB) (*sqliteLedger, error) {
	e.accounts++
	l := &sqliteLedger{db: db, table: fmt.Sprintf("accounts_%d", e.accounts)}
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+l.table+" (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)"); err != nil {
		return nil, err
	}
	if _, err := db.ExecContext(ctx, "WITH RECURSIVE g(i) AS (SELECT 0 UNION ALL SELECT i+1 FROM g WHERE i < 63) INSERT INTO "+l.table+" SELECT i, 0 FROM g"); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *sqliteLedger) credit(ctx context.Context, tx *sql.Tx, worker, n int) error {
	_, err := tx.ExecContext(ctx, "UPDATE "+l.table+" SET balance = balance + ? WHERE id = ?", n, worker)
	return err
}

func (l *sqliteLedger) check(ctx context.Context, s Stream) error {
	l.expected += s.Distinct
	var total int64
	if err := l.db.QueryRowContext(ctx, "SELECT coalesce(sum(balance), 0) FROM "+l.table).Scan(&total); err != nil {
		return err
	}
	if total != int64(l.expected) {
		return fmt.Errorf("ledger holds %d credits, want %d: not exactly once", total, l.expected)
	}
	return nil
}

func sqliteScenarios(perMessage, batched int) []*Scenario {
	var out []*Scenario
	for _, c := range []int{1, 8} {
		row := func(name string, role Role, n int, note string, prep func(context.Context, *Env, *Scenario) (Run, error)) {
			out = append(out, &Scenario{Group: GroupSQLite, Name: name, Role: role, Concurrency: c, DupPercent: 30,
				Messages: n, Note: note, Prepare: prep})
		}
		row("raw INSERT … ON CONFLICT DO NOTHING ×100", RoleCeiling, batched, "no effect", prepSQLiteCeiling)
		row("textbook database/sql tx per message", RoleTextbook, perMessage, "INSERT ON CONFLICT + UPDATE + COMMIT", prepSQLiteTextbook)
		row("idem Claim + Complete", RoleIdem, perMessage, "lease path, one at a time, no effect", prepSQLiteClaim)
		row("idem Process", RoleIdem, perMessage, "one message per call", prepSQLiteProcess)
		row("idem ProcessBatch ×100", RoleIdem, batched, "", prepSQLiteBatch)
	}
	return out
}

func prepSQLiteCeiling(ctx context.Context, env *Env, s *Scenario) (Run, error) {
	e, err := sqliteStores(ctx, env)
	if err != nil {
		return Run{}, err
	}
	return Run{Exec: func(ctx context.Context, st Stream) error {
		return eachBatch(ctx, s.Concurrency, len(st.Keys), BatchSize, func(ctx context.Context, _, lo, hi int) error {
			keys := st.Keys[lo:hi]
			args := make([]any, len(keys))
			for i, k := range keys {
				args[i] = k
			}
			// At most BatchSize placeholders, never user text.
			q := "INSERT INTO ceiling (key) VALUES " + strings.TrimSuffix(strings.Repeat("(?),", len(keys)), ",") + " ON CONFLICT DO NOTHING"
			_, err := e.plain.ExecContext(ctx, q, args...)
			return err
		})
	}}, nil
}

func prepSQLiteTextbook(ctx context.Context, env *Env, s *Scenario) (Run, error) {
	e, err := sqliteStores(ctx, env)
	if err != nil {
		return Run{}, err
	}
	l, err := e.newLedger(ctx, e.plain)
	if err != nil {
		return Run{}, err
	}
	return Run{
		Exec: func(ctx context.Context, st Stream) error {
			return eachMessage(ctx, s.Concurrency, len(st.Keys), func(ctx context.Context, w, i int) error {
				tx, err := e.plain.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				defer func() { _ = tx.Rollback() }()
				res, err := tx.ExecContext(ctx, "INSERT INTO processed (id) VALUES (?) ON CONFLICT DO NOTHING", st.Keys[i])
				if err != nil {
					return err
				}
				if n, _ := res.RowsAffected(); n == 1 {
					if err := l.credit(ctx, tx, w, 1); err != nil {
						return err
					}
				}
				return tx.Commit()
			})
		},
		After: l.check,
	}, nil
}

func prepSQLiteClaim(ctx context.Context, env *Env, s *Scenario) (Run, error) {
	e, err := sqliteStores(ctx, env)
	if err != nil {
		return Run{}, err
	}
	result := []byte(`{"ok":true}`)
	return Run{Exec: func(ctx context.Context, st Stream) error {
		return eachMessage(ctx, s.Concurrency, len(st.Keys), func(ctx context.Context, _, i int) error {
			k := st.Keys[i]
			c, err := e.store.Claim(ctx, idem.ClaimRequest{Scope: "sqlite-claim", Key: k, Lease: time.Minute})
			if err != nil || c.Outcome != idem.Acquired {
				return err // a duplicate is Completed or InProgress: skipped
			}
			return e.store.Complete(ctx, idem.CompleteRequest{Scope: "sqlite-claim", Key: k, Token: c.Token, Result: result, Retention: time.Hour})
		})
	}}, nil
}

func prepSQLiteProcess(ctx context.Context, env *Env, s *Scenario) (Run, error) {
	e, err := sqliteStores(ctx, env)
	if err != nil {
		return Run{}, err
	}
	l, err := e.newLedger(ctx, e.store.DB())
	if err != nil {
		return Run{}, err
	}
	var msgs []idem.Message
	return Run{
		Before: func(_ context.Context, st Stream) error { msgs = st.Messages("sqlite-process"); return nil },
		Exec: func(ctx context.Context, st Stream) error {
			return eachMessage(ctx, s.Concurrency, len(msgs), func(ctx context.Context, w, i int) error {
				_, err := e.store.Process(ctx, msgs[i], func(ctx context.Context, tx *sql.Tx) error {
					return l.credit(ctx, tx, w, 1)
				})
				return err
			})
		},
		After: l.check,
	}, nil
}

func prepSQLiteBatch(ctx context.Context, env *Env, s *Scenario) (Run, error) {
	e, err := sqliteStores(ctx, env)
	if err != nil {
		return Run{}, err
	}
	l, err := e.newLedger(ctx, e.store.DB())
	if err != nil {
		return Run{}, err
	}
	var msgs []idem.Message
	return Run{
		Before: func(_ context.Context, st Stream) error { msgs = st.Messages("sqlite-batch"); return nil },
		Exec: func(ctx context.Context, st Stream) error {
			return eachBatch(ctx, s.Concurrency, len(msgs), BatchSize, func(ctx context.Context, w, lo, hi int) error {
				_, err := e.store.ProcessBatch(ctx, msgs[lo:hi], func(ctx context.Context, tx *sql.Tx, fresh []int) error {
					return l.credit(ctx, tx, w, len(fresh))
				})
				return err
			})
		},
		After: l.check,
	}, nil
}
