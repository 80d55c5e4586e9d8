package idempgx_test

import (
	"context"
	"errors"
	"net"
	"net/url"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest/faultnet"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// relayedStore returns a store whose pool reaches PostgreSQL through a
// faultnet relay, over the schema of base.
func relayedStore(t *testing.T, base *idempgx.Store) (*idempgx.Store, *faultnet.Relay) {
	t.Helper()
	u, err := url.Parse(databaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "5432")
	}
	relay, err := faultnet.Start(host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = relay.Close() })
	u.Host = relay.Addr()
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	s, err := idempgx.New(p, &idempgx.Config{Schema: base.Config().Schema})
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

	res, err := s.Process(ctx, msg, func(context.Context, pgx.Tx) error {
		// From here the server's answers are dropped and the connection is
		// reset as the next one (COMMIT's) starts.
		relay.Set(faultnet.Fault{Hang: true, CutAfterResponse: 1})
		return nil
	})
	relay.Set(faultnet.Fault{}) // let the pool's next connection through
	if !errors.Is(err, idem.ErrCommitUnknown) || !idem.IsRetryable(err) || res != "" {
		t.Fatalf("Process = %q, %v; want an error wrapping ErrCommitUnknown, retryable", res, err)
	}
	// It did commit: the redelivery is a duplicate and its handler does not run.
	res, err = direct.Process(ctx, msg, func(context.Context, pgx.Tx) error {
		t.Error("handler ran again after a commit that happened")
		return nil
	})
	if res != idem.Duplicate || err != nil {
		t.Fatalf("redelivery = %q, %v; want duplicate", res, err)
	}
}

// A commit the server refused is not in doubt.
func TestProcessCommitRefusedIsNotUnknown(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	s := newStore(t, nil)
	msg := idem.Message{Scope: "commit", Key: "refused", Fingerprint: idem.FingerprintBytes([]byte("x"))}
	res, err := s.Process(ctx, msg, func(ctx context.Context, tx pgx.Tx) error {
		// A deferred constraint that fails at COMMIT: the server answers
		// with an error and the transaction rolls back.
		_, err := tx.Exec(ctx, `CREATE TEMP TABLE t (id int PRIMARY KEY DEFERRABLE INITIALLY DEFERRED) ON COMMIT DROP;
			INSERT INTO t VALUES (1), (1)`)
		return err
	})
	if err == nil || errors.Is(err, idem.ErrCommitUnknown) || res != "" {
		t.Fatalf("Process = %q, %v; want the server's error, not ErrCommitUnknown", res, err)
	}
	res, err = s.Process(ctx, msg, func(context.Context, pgx.Tx) error { return nil })
	if res != idem.Processed || err != nil {
		t.Fatalf("after the refused commit = %q, %v; want processed (nothing was recorded)", res, err)
	}
}
