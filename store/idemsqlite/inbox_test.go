package idemsqlite

import (
	"context"
	"database/sql"
	"testing"

	"github.com/idem-go/idem/inbox/inboxtest"
)

// inboxEnv is an inbox over s with an effects table that is deliberately
// not unique on the message id.
func inboxEnv(tb testing.TB, s *Store) inboxtest.Env[*sql.Tx] {
	tb.Helper()
	if _, err := s.DB().ExecContext(context.Background(), "CREATE TABLE IF NOT EXISTS inbox_effects (key TEXT NOT NULL)"); err != nil {
		tb.Fatal(err)
	}
	return inboxtest.Env[*sql.Tx]{
		Backend: s.Inbox(),
		Effect: func(ctx context.Context, tx *sql.Tx, key string) error {
			_, err := tx.ExecContext(ctx, "INSERT INTO inbox_effects (key) VALUES (?)", key)
			return err
		},
		Effects: func(ctx context.Context) (map[string]int, error) {
			rows, err := s.DB().QueryContext(ctx, "SELECT key, count(*) FROM inbox_effects GROUP BY key")
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			out := map[string]int{}
			for rows.Next() {
				var (
					k string
					n int
				)
				if err := rows.Scan(&k, &n); err != nil {
					return nil, err
				}
				out[k] = n
			}
			return out, rows.Err()
		},
	}
}

func TestInbox(t *testing.T) {
	t.Parallel()
	inboxtest.Run(t, func(t *testing.T) inboxtest.Env[*sql.Tx] {
		return inboxEnv(t, newTestStore(t, nil))
	})
}
