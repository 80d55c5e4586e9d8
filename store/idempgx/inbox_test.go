package idempgx_test

import (
	"context"
	"testing"

	"github.com/idem-go/idem/inbox/inboxtest"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/jackc/pgx/v5"
)

// newInboxEnv is an inbox in a fresh schema with an effects table that is
// deliberately not unique on the message id.
func newInboxEnv(tb testing.TB) (inboxtest.Env[pgx.Tx], *idempgx.Store) {
	tb.Helper()
	s := newStore(tb, nil)
	effects := qualified(s, "inbox_effects")
	if _, err := s.Pool().Exec(context.Background(), "CREATE TABLE "+effects+" (key text NOT NULL)"); err != nil {
		tb.Fatal(err)
	}
	return inboxtest.Env[pgx.Tx]{
		Backend: s.Inbox(),
		Effect: func(ctx context.Context, tx pgx.Tx, key string) error {
			_, err := tx.Exec(ctx, "INSERT INTO "+effects+" (key) VALUES ($1)", key)
			return err
		},
		Effects: func(ctx context.Context) (map[string]int, error) {
			rows, err := s.Pool().Query(ctx, "SELECT key, count(*) FROM "+effects+" GROUP BY key")
			if err != nil {
				return nil, err
			}
			out := map[string]int{}
			var (
				k string
				n int
			)
			_, err = pgx.ForEachRow(rows, []any{&k, &n}, func() error { out[k] = n; return nil })
			return out, err
		},
	}, s
}

func TestInbox(t *testing.T) {
	t.Parallel()
	inboxtest.Run(t, func(t *testing.T) inboxtest.Env[pgx.Tx] {
		env, _ := newInboxEnv(t)
		return env
	})
}
