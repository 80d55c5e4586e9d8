package idempgx_test

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"testing"

	"github.com/idem-go/idem/inbox/inboxtest"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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

// envInboxSchema tells a re-executed test binary to serve as an acceptance
// worker over that schema.
const envInboxSchema = "IDEMPGX_INBOX_WORKER_SCHEMA"

// TestInboxWorkerProcess is the body of the acceptance test's worker
// processes; it does nothing in a normal run.
func TestInboxWorkerProcess(t *testing.T) {
	s := childStore(t, envInboxSchema, "worker process of TestInboxAcceptance", envInt(inboxtest.EnvWorkers, 8)+4)
	effects := qualified(s, "inbox_effects")
	err := inboxtest.ServeWorker(inboxtest.Env[pgx.Tx]{Backend: s.Inbox(), Effect: func(ctx context.Context, tx pgx.Tx, key string) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+effects+" (key) VALUES ($1)", key)
		return err
	}})
	if err != nil {
		t.Fatal(err)
	}
}

// childStore is the store of an acceptance test's child process over the
// schema the environment variable env names, with conns connections; in a
// normal run (env unset) it skips the test with skip.
func childStore(t *testing.T, env, skip string, conns int) *idempgx.Store {
	schema := os.Getenv(env)
	if schema == "" {
		t.Skip(skip)
	}
	cfg, err := pgxpool.ParseConfig(databaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = int32(conns)
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	s, err := idempgx.New(p, &idempgx.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// childCmd returns the commands that run this test binary's test run as an
// acceptance child process over the schema of s (passed in env).
func childCmd(s *idempgx.Store, run, env string) func() *exec.Cmd {
	return func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^"+run+"$", "-test.count=1")
		cmd.Env = append(os.Environ(), env+"="+s.Config().Schema)
		return cmd
	}
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// TestInboxAcceptance: several worker processes, random handler failures
// and SIGKILLs; every message processed exactly once or dead.
func TestInboxAcceptance(t *testing.T) {
	t.Parallel()
	env, s := newInboxEnv(t)
	inboxtest.RunAcceptance(t, env, childCmd(s, "TestInboxWorkerProcess", envInboxSchema))
}
