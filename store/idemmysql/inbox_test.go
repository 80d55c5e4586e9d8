package idemmysql_test

import (
	"context"
	"database/sql"
	"os"
	"os/exec"
	"strconv"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/idem-go/idem/inbox/inboxtest"
	"github.com/idem-go/idem/store/idemmysql"
)

// inboxEnv is an inbox over db with an effects table that is deliberately
// not unique on the message id.
func inboxEnv(s *idemmysql.Store) inboxtest.Env[*sql.Tx] {
	return inboxtest.Env[*sql.Tx]{
		Backend: s.Inbox(),
		Effect: func(ctx context.Context, tx *sql.Tx, key string) error {
			_, err := tx.ExecContext(ctx, "INSERT INTO inbox_effects (`key`) VALUES (?)", key)
			return err
		},
		Effects: func(ctx context.Context) (map[string]int, error) {
			return countEffects(ctx, s.DB(), "inbox_effects")
		},
	}
}

// newInboxEnv is an inbox in a fresh database.
func newInboxEnv(tb testing.TB) (inboxtest.Env[*sql.Tx], *idemmysql.Store) {
	tb.Helper()
	s := newStore(tb, nil)
	if _, err := s.DB().Exec("CREATE TABLE inbox_effects (`key` VARBINARY(255) NOT NULL)"); err != nil {
		tb.Fatal(err)
	}
	return inboxEnv(s), s
}

func TestInbox(t *testing.T) {
	t.Parallel()
	inboxtest.Run(t, func(t *testing.T) inboxtest.Env[*sql.Tx] {
		env, _ := newInboxEnv(t)
		return env
	})
}

// envInboxDatabase tells a re-executed test binary to serve as an
// acceptance worker over that database.
const envInboxDatabase = "IDEMMYSQL_INBOX_WORKER_DATABASE"

// TestInboxWorkerProcess is the body of the acceptance test's worker
// processes; it does nothing in a normal run.
func TestInboxWorkerProcess(t *testing.T) {
	s := childStore(t, envInboxDatabase, "worker process of TestInboxAcceptance", envInt(inboxtest.EnvWorkers, 8)+4)
	if err := inboxtest.ServeWorker(inboxEnv(s)); err != nil {
		t.Fatal(err)
	}
}

// childStore is the store of an acceptance test's child process over the
// database the environment variable env names, with conns connections; in
// a normal run (env unset) it skips the test with skip.
func childStore(t *testing.T, env, skip string, conns int) *idemmysql.Store {
	name := os.Getenv(env)
	if name == "" {
		t.Skip(skip)
	}
	cfg := driverConfig(t)
	cfg.DBName = name
	c, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(c)
	t.Cleanup(func() { db.Close() })
	db.SetMaxOpenConns(conns)
	s, err := idemmysql.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// childCmd returns the commands that run this test binary's test run as an
// acceptance child process over the database of s (passed in env).
func childCmd(t *testing.T, s *idemmysql.Store, run, env string) func() *exec.Cmd {
	var name string
	if err := s.DB().QueryRow("SELECT DATABASE()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	return func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^"+run+"$", "-test.count=1")
		cmd.Env = append(os.Environ(), env+"="+name)
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
	inboxtest.RunAcceptance(t, env, childCmd(t, s, "TestInboxWorkerProcess", envInboxDatabase))
}
