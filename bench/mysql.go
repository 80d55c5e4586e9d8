package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idemmysql"
)

// myEnv is the MySQL / MariaDB state the scenarios share: one database for
// idem, the textbook and the ceiling tables.
type myEnv struct {
	db       *sql.DB
	store    *idemmysql.Store
	accounts int
}

func mysqlStores(ctx context.Context, env *Env) (*myEnv, error) {
	return sharedValue(env, "mysql", func() (*myEnv, error) {
		cfg, err := mysqlConfig(env.MySQLURL)
		if err != nil {
			return nil, err
		}
		admin, err := openMySQL(cfg, 1)
		if err != nil {
			return nil, err
		}
		env.Cleanup(func() { _ = admin.Close() })
		name := "idembench_" + env.Prefix
		if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
			return nil, err
		}
		env.Cleanup(func() { _, _ = admin.ExecContext(context.Background(), "DROP DATABASE "+name) })
		cfg.DBName = name
		db, err := openMySQL(cfg, 40)
		if err != nil {
			return nil, err
		}
		env.Cleanup(func() { _ = db.Close() })
		m, err := idemmysql.NewMigrator(db)
		if err != nil {
			return nil, err
		}
		if _, err := m.Up(ctx); err != nil {
			return nil, err
		}
		e := &myEnv{db: db}
		if e.store, err = idemmysql.New(db, nil); err != nil {
			return nil, err
		}
		for _, q := range []string{
			"CREATE TABLE processed (id VARBINARY(255) PRIMARY KEY)",
			"CREATE TABLE ceiling (scope VARBINARY(255) NOT NULL, `key` VARBINARY(255) NOT NULL, PRIMARY KEY (scope, `key`))",
		} {
			if _, err := db.ExecContext(ctx, q); err != nil {
				return nil, err
			}
		}
		return e, nil
	})
}

// mysqlConfig parses a mysql:// URL or a go-sql-driver DSN.
func mysqlConfig(url string) (*mysql.Config, error) {
	if strings.Contains(url, "://") {
		return idemmysql.ParseURL(url)
	}
	cfg, err := mysql.ParseDSN(url)
	if err != nil {
		return nil, errors.New("the MySQL URL is neither a mysql:// URL nor a driver DSN")
	}
	return cfg, nil
}

func openMySQL(cfg *mysql.Config, conns int) (*sql.DB, error) {
	c, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(c)
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	return db, nil
}

// myLedger is the MySQL twin of ledger.
type myLedger struct {
	db       *sql.DB
	table    string
	expected int
}

func (e *myEnv) newLedger(ctx context.Context) (*myLedger, error) {
	e.accounts++
	l := &myLedger{db: e.db, table: fmt.Sprintf("accounts_%d", e.accounts)}
	if _, err := e.db.ExecContext(ctx, "CREATE TABLE "+l.table+" (id INT PRIMARY KEY, balance BIGINT NOT NULL)"); err != nil {
		return nil, err
	}
	rows := strings.TrimSuffix(strings.Repeat("(?, 0),", 64), ",")
	args := make([]any, 64)
	for i := range args {
		args[i] = i
	}
	if _, err := e.db.ExecContext(ctx, "INSERT INTO "+l.table+" VALUES "+rows, args...); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *myLedger) credit(ctx context.Context, tx *sql.Tx, worker, n int) error {
	_, err := tx.ExecContext(ctx, "UPDATE "+l.table+" SET balance = balance + ? WHERE id = ?", n, worker)
	return err
}

func (l *myLedger) check(ctx context.Context, s Stream) error {
	l.expected += s.Distinct
	var total int64
	if err := l.db.QueryRowContext(ctx, "SELECT COALESCE(SUM(balance), 0) FROM "+l.table).Scan(&total); err != nil {
		return err
	}
	if total != int64(l.expected) {
		return fmt.Errorf("ledger holds %d credits, want %d: not exactly once", total, l.expected)
	}
	return nil
}

func mysqlScenarios(perMessage, batched int) []*Scenario {
	var out []*Scenario
	for _, c := range []int{1, 8} {
		row := func(name string, role Role, n int, note string, prep func(context.Context, *Env, *Scenario) (Run, error)) {
			out = append(out, &Scenario{Group: GroupMySQL, Name: name, Role: role, Concurrency: c, DupPercent: 30,
				Messages: n, Note: note, Needs: NeedsMySQL, Prepare: prep})
		}
		row("raw multi-row INSERT … ON DUPLICATE KEY UPDATE ×100", RoleCeiling, batched, "no effect, no transaction", prepMyCeiling)
		row("textbook database/sql tx per message", RoleTextbook, perMessage, "INSERT (duplicate key caught) + UPDATE + COMMIT", prepMyTextbook)
		row("idem Process", RoleIdem, perMessage, "one message per call", prepMyProcess)
		row("idem ProcessBatch ×100", RoleIdem, batched, "", prepMyBatch)
	}
	return out
}

func prepMyCeiling(ctx context.Context, env *Env, s *Scenario) (Run, error) {
	e, err := mysqlStores(ctx, env)
	if err != nil {
		return Run{}, err
	}
	var rows int64
	return Run{
		Exec: func(ctx context.Context, st Stream) error {
			return eachBatch(ctx, s.Concurrency, len(st.Keys), BatchSize, func(ctx context.Context, _, lo, hi int) error {
				keys := sortedUnique(st.Keys[lo:hi])
				args := make([]any, 0, 2*len(keys))
				for _, k := range keys {
					args = append(args, s.ID(), k)
				}
				// At most BatchSize rows of placeholders, never user text.
				q := "INSERT INTO ceiling (scope, `key`) VALUES " + strings.TrimSuffix(strings.Repeat("(?, ?),", len(keys)), ",") +
					" ON DUPLICATE KEY UPDATE scope = scope"
				_, err := e.db.ExecContext(ctx, q, args...)
				return err
			})
		},
		After: func(ctx context.Context, st Stream) error {
			rows += int64(st.Distinct)
			var n int64
			if err := e.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM ceiling WHERE scope = ?", s.ID()).Scan(&n); err != nil {
				return err
			}
			if n != rows {
				return fmt.Errorf("%d rows, want %d", n, rows)
			}
			return nil
		},
	}, nil
}

func prepMyTextbook(ctx context.Context, env *Env, s *Scenario) (Run, error) {
	e, err := mysqlStores(ctx, env)
	if err != nil {
		return Run{}, err
	}
	l, err := e.newLedger(ctx)
	if err != nil {
		return Run{}, err
	}
	return Run{
		Exec: func(ctx context.Context, st Stream) error {
			return eachMessage(ctx, s.Concurrency, len(st.Keys), func(ctx context.Context, w, i int) error {
				tx, err := e.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
				if err != nil {
					return err
				}
				defer func() { _ = tx.Rollback() }()
				_, err = tx.ExecContext(ctx, "INSERT INTO processed (id) VALUES (?)", st.Keys[i])
				var me *mysql.MySQLError
				if errors.As(err, &me) && me.Number == 1062 {
					return nil // a duplicate: nothing to credit
				}
				if err != nil {
					return err
				}
				if err := l.credit(ctx, tx, w, 1); err != nil {
					return err
				}
				return tx.Commit()
			})
		},
		After: l.check,
	}, nil
}

func prepMyProcess(ctx context.Context, env *Env, s *Scenario) (Run, error) {
	e, err := mysqlStores(ctx, env)
	if err != nil {
		return Run{}, err
	}
	l, err := e.newLedger(ctx)
	if err != nil {
		return Run{}, err
	}
	var msgs []idem.Message
	return Run{
		Before: func(_ context.Context, st Stream) error { msgs = st.Messages("my-process"); return nil },
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

func prepMyBatch(ctx context.Context, env *Env, s *Scenario) (Run, error) {
	e, err := mysqlStores(ctx, env)
	if err != nil {
		return Run{}, err
	}
	l, err := e.newLedger(ctx)
	if err != nil {
		return Run{}, err
	}
	var msgs []idem.Message
	return Run{
		Before: func(_ context.Context, st Stream) error { msgs = st.Messages("my-batch"); return nil },
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

// mysqlVersion is the server's SELECT VERSION(), or "" when it cannot be read.
func mysqlVersion(ctx context.Context, url string) string {
	cfg, err := mysqlConfig(url)
	if err != nil {
		return ""
	}
	db, err := openMySQL(cfg, 1)
	if err != nil {
		return ""
	}
	defer db.Close()
	var v string
	_ = db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&v)
	return v
}
