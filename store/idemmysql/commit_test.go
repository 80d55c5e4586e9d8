package idemmysql_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest/faultnet"
	"github.com/idem-go/idem/store/idemmysql"
)

// relayedStore returns a store of one connection that reaches the server
// through a faultnet relay, over the database of base.
func relayedStore(t *testing.T, base *idemmysql.Store) (*idemmysql.Store, *faultnet.Relay) {
	t.Helper()
	var name string
	if err := base.DB().QueryRow("SELECT DATABASE()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	cfg := driverConfig(t)
	relay, err := faultnet.Start(cfg.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = relay.Close() })
	cfg.Addr, cfg.DBName = relay.Addr(), name
	c, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(c)
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { _ = db.Close() })
	s, err := idemmysql.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s, relay
}

// A COMMIT that reaches the server and whose answer is lost may have
// committed: Process says so with idem.ErrCommitUnknown (and retryable),
// and the redelivery finds the message a Duplicate.
func TestProcessCommitOutcomeUnknown(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	direct := newStore(t, nil)
	s, relay := relayedStore(t, direct)
	msg := idem.Message{Scope: "commit", Key: "lost-answer", Fingerprint: idem.FingerprintBytes([]byte("x"))}

	res, err := s.Process(ctx, msg, func(context.Context, *sql.Tx) error {
		// From here the server's answers are dropped and the connection is
		// reset as the next one (COMMIT's) starts.
		relay.Set(faultnet.Fault{Hang: true, CutAfterResponse: 1})
		return nil
	})
	relay.Set(faultnet.Fault{})
	if !errors.Is(err, idem.ErrCommitUnknown) || !idem.IsRetryable(err) || res != "" {
		t.Fatalf("Process = %q, %v; want an error wrapping ErrCommitUnknown, retryable", res, err)
	}
	// It did commit: the redelivery is a duplicate and its handler does not run.
	res, err = direct.Process(ctx, msg, func(context.Context, *sql.Tx) error {
		t.Error("handler ran again after a commit that happened")
		return nil
	})
	if res != idem.Duplicate || err != nil {
		t.Fatalf("redelivery = %q, %v; want duplicate", res, err)
	}
}

// A handler error rolls back and is not a commit in doubt; the message is
// processed on redelivery.
func TestProcessHandlerErrorIsNotUnknown(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	s := newStore(t, nil)
	msg := idem.Message{Scope: "commit", Key: "refused", Fingerprint: idem.FingerprintBytes([]byte("x"))}
	res, err := s.Process(ctx, msg, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO no_such_table VALUES (1)")
		return err
	})
	if err == nil || errors.Is(err, idem.ErrCommitUnknown) || idem.IsRetryable(err) || res != "" {
		t.Fatalf("Process = %q, %v; want the server's error, not retryable, not ErrCommitUnknown", res, err)
	}
	var me *mysql.MySQLError
	if !errors.As(err, &me) || me.Number != 1146 {
		t.Fatalf("Process error %v does not carry the server's error 1146", err)
	}
	res, err = s.Process(ctx, msg, func(context.Context, *sql.Tx) error { return nil })
	if res != idem.Processed || err != nil {
		t.Fatalf("after the failed handler = %q, %v; want processed (nothing was recorded)", res, err)
	}
}
