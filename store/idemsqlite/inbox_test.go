package idemsqlite

import (
	"context"
	"database/sql"
	"os"
	"os/exec"
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

// envInboxDB tells a re-executed test binary to serve as an acceptance
// worker over that database file.
const envInboxDB = "IDEMSQLITE_INBOX_WORKER_DB"

// TestInboxWorkerProcess is the body of the acceptance test's worker
// processes; it does nothing in a normal run.
func TestInboxWorkerProcess(t *testing.T) {
	path := os.Getenv(envInboxDB)
	if path == "" {
		t.Skip("worker process of TestInboxAcceptance")
	}
	s, err := Open(context.Background(), path, &Config{Logger: quietLogger})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := inboxtest.ServeWorker(inboxEnv(t, s)); err != nil {
		t.Fatal(err)
	}
}

// TestInboxAcceptance: several worker processes on one SQLite file, random
// handler failures and SIGKILLs; every message processed exactly once or
// dead.
func TestInboxAcceptance(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, nil)
	env := inboxEnv(t, s)
	inboxtest.RunAcceptance(t, env, func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^TestInboxWorkerProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), envInboxDB+"="+s.Path())
		return cmd
	})
}
