package idempgx_test

import (
	"context"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest/storetest"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/jackc/pgx/v5"
)

const conformanceMaxResult = 4096

func TestConformance(t *testing.T) {
	t.Parallel()
	testPool(t)
	storetest.Run(t, func(t *testing.T) idem.Store {
		return newStore(t, &idempgx.Config{MaxResultBytes: conformanceMaxResult})
	}, &storetest.Options{MaxResultBytes: conformanceMaxResult, ClockPrecision: time.Microsecond})
}

func TestProcessConformance(t *testing.T) {
	t.Parallel()
	testPool(t)
	storetest.RunProcess(t, func(t *testing.T) storetest.ProcessEnv {
		return newProcessEnv(t)
	})
}

// processEnv adapts the transactional path to the suite: the effect of a
// message is one row in an effects table of the test's schema.
type processEnv struct {
	s       *idempgx.Store
	effects string
}

func newProcessEnv(tb testing.TB) *processEnv {
	tb.Helper()
	return newProcessEnvOn(tb, newStore(tb, nil))
}

// newProcessEnvOn is newProcessEnv over the store s.
func newProcessEnvOn(tb testing.TB, s *idempgx.Store) *processEnv {
	tb.Helper()
	e := &processEnv{s: s, effects: qualified(s, "effects")}
	if _, err := s.Pool().Exec(context.Background(), "CREATE TABLE "+e.effects+" (key text NOT NULL)"); err != nil {
		tb.Fatal(err)
	}
	return e
}

func (e *processEnv) Process(ctx context.Context, msg idem.Message, fail error) (idem.Outcome, error) {
	return e.s.Process(ctx, msg, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO "+e.effects+" (key) VALUES ($1)", msg.Key); err != nil {
			return err
		}
		return fail
	})
}

func (e *processEnv) ProcessBatch(ctx context.Context, msgs []idem.Message, fail error) ([]idem.Outcome, error) {
	return e.s.ProcessBatch(ctx, msgs, func(ctx context.Context, tx pgx.Tx, fresh []int) error {
		keys := make([]string, len(fresh))
		for n, i := range fresh {
			keys[n] = msgs[i].Key
		}
		if _, err := tx.Exec(ctx, "INSERT INTO "+e.effects+" (key) SELECT unnest($1::text[])", keys); err != nil {
			return err
		}
		return fail
	})
}

func (e *processEnv) Effects(ctx context.Context) (map[string]int, error) {
	rows, err := e.s.Pool().Query(ctx, "SELECT key, count(*) FROM "+e.effects+" GROUP BY key")
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	var (
		key string
		n   int
	)
	_, err = pgx.ForEachRow(rows, []any{&key, &n}, func() error {
		out[key] = n
		return nil
	})
	return out, err
}

func TestListConformance(t *testing.T) {
	t.Parallel()
	testPool(t)
	storetest.RunList(t, func(t *testing.T) idem.Store { return newStore(t, nil) }, nil)
}
