package idempgx_test

import (
	"context"
	"testing"

	"github.com/idem-go/idem/outbox/outboxtest"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/jackc/pgx/v5"
)

// outboxEnv is the outbox of s, with a "published" table standing for the
// broker in the acceptance test (no unique constraint, so duplicates show).
func outboxEnv(s *idempgx.Store) outboxtest.Env[pgx.Tx] {
	published := qualified(s, "outbox_published")
	return outboxtest.Env[pgx.Tx]{
		Backend: s.Outbox(),
		InTx: func(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
			return pgx.BeginFunc(ctx, s.Pool(), func(tx pgx.Tx) error { return fn(ctx, tx) })
		},
		Record: func(ctx context.Context, ids []string) error {
			_, err := s.Pool().Exec(ctx, "INSERT INTO "+published+" (id) SELECT unnest($1::text[])", ids)
			return err
		},
		Recorded: func(ctx context.Context) (map[string]int, error) {
			rows, err := s.Pool().Query(ctx, "SELECT id, count(*) FROM "+published+" GROUP BY id")
			if err != nil {
				return nil, err
			}
			out := map[string]int{}
			var (
				id string
				n  int
			)
			_, err = pgx.ForEachRow(rows, []any{&id, &n}, func() error { out[id] = n; return nil })
			return out, err
		},
	}
}

func newOutboxEnv(tb testing.TB) (outboxtest.Env[pgx.Tx], *idempgx.Store) {
	tb.Helper()
	s := newStore(tb, nil)
	if _, err := s.Pool().Exec(context.Background(), "CREATE TABLE "+qualified(s, "outbox_published")+" (id text NOT NULL)"); err != nil {
		tb.Fatal(err)
	}
	return outboxEnv(s), s
}

func TestOutbox(t *testing.T) {
	t.Parallel()
	outboxtest.Run(t, func(t *testing.T) outboxtest.Env[pgx.Tx] {
		env, _ := newOutboxEnv(t)
		return env
	})
}

// envOutboxSchema tells a re-executed test binary to serve as an
// acceptance relay over that schema.
const envOutboxSchema = "IDEMPGX_OUTBOX_RELAY_SCHEMA"

// TestOutboxRelayProcess is the body of the acceptance test's relay
// processes; it does nothing in a normal run.
func TestOutboxRelayProcess(t *testing.T) {
	s := childStore(t, envOutboxSchema, "relay process of TestOutboxAcceptance", envInt(outboxtest.EnvWorkers, 4)+2)
	if err := outboxtest.ServeRelay(outboxEnv(s)); err != nil {
		t.Fatal(err)
	}
}

// TestOutboxAcceptance: producers commit and roll back while relay
// processes are SIGKILLed mid-batch; every committed event is published
// (duplicates only under its own id), none of a rolled-back transaction.
func TestOutboxAcceptance(t *testing.T) {
	t.Parallel()
	env, s := newOutboxEnv(t)
	outboxtest.RunAcceptance(t, env, childCmd(s, "TestOutboxRelayProcess", envOutboxSchema))
}
