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
	name := os.Getenv(envInboxDatabase)
	if name == "" {
		t.Skip("worker process of TestInboxAcceptance")
	}
	cfg := driverConfig(t)
	cfg.DBName = name
	c, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(c)
	defer db.Close()
	db.SetMaxOpenConns(envInt(inboxtest.EnvWorkers, 8) + 4)
	s, err := idemmysql.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := inboxtest.ServeWorker(inboxEnv(s)); err != nil {
		t.Fatal(err)
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
	var name string
	if err := s.DB().QueryRow("SELECT DATABASE()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	inboxtest.RunAcceptance(t, env, func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^TestInboxWorkerProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), envInboxDatabase+"="+name)
		return cmd
	})
}
