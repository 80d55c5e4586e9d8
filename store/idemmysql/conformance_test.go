package idemmysql_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest/storetest"
	"github.com/idem-go/idem/store/idemmysql"
)

const conformanceMaxResult = 4096

func TestConformance(t *testing.T) {
	t.Parallel()
	adminDB(t)
	storetest.Run(t, func(t *testing.T) idem.Store {
		return newStore(t, &idemmysql.Config{MaxResultBytes: conformanceMaxResult})
	}, &storetest.Options{MaxResultBytes: conformanceMaxResult, ClockPrecision: time.Microsecond})
}

func TestListConformance(t *testing.T) {
	t.Parallel()
	adminDB(t)
	storetest.RunList(t, func(t *testing.T) idem.Store { return newStore(t, nil) }, nil)
}

func TestProcessConformance(t *testing.T) {
	t.Parallel()
	adminDB(t)
	storetest.RunProcess(t, func(t *testing.T) storetest.ProcessEnv {
		return newProcessEnv(t)
	})
}

// processEnv adapts the transactional path to the suite: the effect of a
// message is one row in an effects table of the test's database.
type processEnv struct {
	s *idemmysql.Store
}

func newProcessEnv(tb testing.TB) *processEnv {
	tb.Helper()
	s := newStore(tb, nil)
	if _, err := s.DB().Exec("CREATE TABLE effects (`key` VARBINARY(255) NOT NULL)"); err != nil {
		tb.Fatal(err)
	}
	return &processEnv{s: s}
}

func (e *processEnv) Process(ctx context.Context, msg idem.Message, fail error) (idem.Outcome, error) {
	return e.s.Process(ctx, msg, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, "INSERT INTO effects (`key`) VALUES (?)", msg.Key); err != nil {
			return err
		}
		return fail
	})
}

func (e *processEnv) ProcessBatch(ctx context.Context, msgs []idem.Message, fail error) ([]idem.Outcome, error) {
	return e.s.ProcessBatch(ctx, msgs, func(ctx context.Context, tx *sql.Tx, fresh []int) error {
		args := make([]any, len(fresh))
		q := "INSERT INTO effects (`key`) VALUES "
		for n, i := range fresh {
			args[n] = msgs[i].Key
			if n > 0 {
				q += ", "
			}
			q += "(?)"
		}
		if _, err := tx.ExecContext(ctx, q, args...); err != nil {
			return err
		}
		return fail
	})
}

func (e *processEnv) Effects(ctx context.Context) (map[string]int, error) {
	return countEffects(ctx, e.s.DB(), "effects")
}

// countEffects counts the rows of an effects table per key.
func countEffects(ctx context.Context, db *sql.DB, table string) (map[string]int, error) {
	rows, err := db.QueryContext(ctx, "SELECT `key`, COUNT(*) FROM "+table+" GROUP BY `key`")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var (
			key string
			n   int
		)
		if err := rows.Scan(&key, &n); err != nil {
			return nil, err
		}
		out[key] = n
	}
	return out, rows.Err()
}
