package idemsqlite

import (
	"context"
	"database/sql"
	"os"
	"os/exec"
	"testing"

	"github.com/idem-go/idem/outbox/outboxtest"
)

// outboxEnv is the outbox of s, with a "published" table standing for the
// broker in the acceptance test (no unique constraint, so duplicates show).
func outboxEnv(tb testing.TB, s *Store) outboxtest.Env[*sql.Tx] {
	tb.Helper()
	if _, err := s.DB().ExecContext(context.Background(), "CREATE TABLE IF NOT EXISTS outbox_published (id TEXT NOT NULL)"); err != nil {
		tb.Fatal(err)
	}
	return outboxtest.Env[*sql.Tx]{
		Backend:      s.Outbox(),
		InTx:         retryBusy(outboxtest.SQLInTx(s.DB())),
		Record:       outboxtest.SQLRecord(s.DB(), "outbox_published"),
		Recorded:     outboxtest.SQLRecorded(s.DB(), "outbox_published"),
		SingleWriter: true,
	}
}

// retryBusy retries a producer's transaction that SQLite refused with
// SQLITE_BUSY (busy_timeout ran out: the suite runs dozens of relay loops
// and producers on one file, on a loaded host), as an application retries
// a retryable error; a busy transaction committed nothing.
func retryBusy(inTx func(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error) func(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	return func(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
		for {
			err := inTx(ctx, fn)
			if err == nil || !isBusy(err) || ctx.Err() != nil {
				return err
			}
		}
	}
}

func TestOutbox(t *testing.T) {
	t.Parallel()
	outboxtest.Run(t, func(t *testing.T) outboxtest.Env[*sql.Tx] {
		return outboxEnv(t, newTestStore(t, nil))
	})
}

// envOutboxDB tells a re-executed test binary to serve as an acceptance
// relay over that database file.
const envOutboxDB = "IDEMSQLITE_OUTBOX_RELAY_DB"

// TestOutboxRelayProcess is the body of the acceptance test's relay
// processes; it does nothing in a normal run.
func TestOutboxRelayProcess(t *testing.T) {
	path := os.Getenv(envOutboxDB)
	if path == "" {
		t.Skip("relay process of TestOutboxAcceptance")
	}
	s, err := Open(context.Background(), path, &Config{Logger: quietLogger})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := outboxtest.ServeRelay(outboxEnv(t, s)); err != nil {
		t.Fatal(err)
	}
}

// TestOutboxAcceptance: relay processes on one SQLite file SIGKILLed
// mid-batch; every committed event is published (duplicates only under
// its own id), none of a rolled-back transaction.
func TestOutboxAcceptance(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, nil)
	env := outboxEnv(t, s)
	outboxtest.RunAcceptance(t, env, func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^TestOutboxRelayProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), envOutboxDB+"="+s.Path())
		return cmd
	})
}
