package idemmysql_test

import (
	"database/sql"
	"testing"

	"github.com/idem-go/idem/outbox/outboxtest"
	"github.com/idem-go/idem/store/idemmysql"
)

// outboxEnv is the outbox of s, with a "published" table standing for the
// broker in the acceptance test (no unique constraint, so duplicates show).
func outboxEnv(s *idemmysql.Store) outboxtest.Env[*sql.Tx] {
	return outboxtest.Env[*sql.Tx]{
		Backend:  s.Outbox(),
		InTx:     outboxtest.SQLInTx(s.DB()),
		Record:   outboxtest.SQLRecord(s.DB(), "outbox_published"),
		Recorded: outboxtest.SQLRecorded(s.DB(), "outbox_published"),
	}
}

// newOutboxEnv is an outbox in a fresh database.
func newOutboxEnv(tb testing.TB) (outboxtest.Env[*sql.Tx], *idemmysql.Store) {
	tb.Helper()
	s := newStore(tb, nil)
	if _, err := s.DB().Exec("CREATE TABLE outbox_published (id VARBINARY(255) NOT NULL)"); err != nil {
		tb.Fatal(err)
	}
	return outboxEnv(s), s
}

func TestOutbox(t *testing.T) {
	t.Parallel()
	outboxtest.Run(t, func(t *testing.T) outboxtest.Env[*sql.Tx] {
		env, _ := newOutboxEnv(t)
		return env
	})
}

// envOutboxDatabase tells a re-executed test binary to serve as an
// acceptance relay over that database.
const envOutboxDatabase = "IDEMMYSQL_OUTBOX_RELAY_DATABASE"

// TestOutboxRelayProcess is the body of the acceptance test's relay
// processes; it does nothing in a normal run.
func TestOutboxRelayProcess(t *testing.T) {
	s := childStore(t, envOutboxDatabase, "relay process of TestOutboxAcceptance", envInt(outboxtest.EnvWorkers, 4)+2)
	if err := outboxtest.ServeRelay(outboxEnv(s)); err != nil {
		t.Fatal(err)
	}
}

// TestOutboxAcceptance: relay processes SIGKILLed mid-batch; every
// committed event is published (duplicates only under its own id), none
// of a rolled-back transaction.
func TestOutboxAcceptance(t *testing.T) {
	t.Parallel()
	env, s := newOutboxEnv(t)
	outboxtest.RunAcceptance(t, env, childCmd(t, s, "TestOutboxRelayProcess", envOutboxDatabase))
}
