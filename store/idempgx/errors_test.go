package idempgx_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

func TestIsRetryableError(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{&pgconn.PgError{Code: "40001"}, true},
		{&pgconn.PgError{Code: "40P01"}, true},
		{&pgconn.PgError{Code: "57P01"}, true},
		{&pgconn.PgError{Code: "08006"}, true},
		{fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: "40001"}), true},
		{&pgconn.PgError{Code: "23505"}, false}, // unique violation: a bug, not a blip
		{&pgconn.PgError{Code: "42601"}, false}, // syntax error
		{io.EOF, true},
		{io.ErrUnexpectedEOF, true},
		{fmt.Errorf("read: %w", io.EOF), true},
		{context.DeadlineExceeded, true}, // pgconn.Timeout
		{context.Canceled, false},
		{errors.New("something else"), false},
	} {
		if got := idempgx.IsRetryableError(tc.err); got != tc.want {
			t.Errorf("IsRetryableError(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func TestUnreachableServer(t *testing.T) {
	t.Parallel()
	databaseURL(t) // the package's tests are PostgreSQL tests
	p, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	s, err := idempgx.New(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	err = s.Ping(ctx)
	if err == nil {
		t.Fatal("Ping against port 1 succeeded")
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Ping took %v; want a quick failure", d)
	}
	if !idem.IsRetryable(err) || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Errorf("Ping error = %v; want a retryable error naming the server", err)
	}
	if _, err := s.Claim(ctx, idem.ClaimRequest{Key: "k", Lease: time.Second}); !idem.IsRetryable(err) {
		t.Errorf("claim error = %v; want retryable", err)
	}
}

func TestSerializationFailureIsRetryable(t *testing.T) {
	t.Parallel()
	s := newStore(t, nil)
	ctx := ctxT(t)
	msg := idem.Message{Scope: "c", Key: "m1", Fingerprint: fp("x")}

	tx, err := s.Pool().BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT count(*) FROM "+qualified(s, "idem_records")); err != nil { // takes the snapshot
		t.Fatal(err)
	}
	if res, err := s.Process(ctx, msg, func(context.Context, pgx.Tx) error { return nil }); err != nil || res != idem.Processed {
		t.Fatal(res, err)
	}
	_, err = s.ProcessTx(ctx, tx, msg)
	var pgErr *pgconn.PgError
	if !idem.IsRetryable(err) || !errors.As(err, &pgErr) || pgErr.Code != "40001" {
		t.Fatalf("ProcessTx in a stale REPEATABLE READ snapshot = %v; want retryable 40001", err)
	}
}

func TestTerminatedBackendIsRetryable(t *testing.T) {
	t.Parallel()
	url := databaseURL(t)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	own, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	ctx := ctxT(t)
	schema := migratedSchema(t)
	s, _ := idempgx.New(own, &idempgx.Config{Schema: schema})
	var pid uint32
	if err := own.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := testPool(t).Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // let the server close the socket
	_, err = s.Claim(ctx, idem.ClaimRequest{Key: "k", Lease: time.Second})
	if err == nil {
		t.Skip("pgxpool noticed the dead connection before use; nothing to classify")
	}
	if !idem.IsRetryable(err) || !strings.HasPrefix(err.Error(), "idempgx: claim") {
		t.Fatalf("claim on a terminated backend = %v; want retryable", err)
	}
	// The pool recovers with a new connection.
	if c, err := s.Claim(ctx, idem.ClaimRequest{Key: "k", Lease: time.Second}); err != nil || c.Outcome != idem.Acquired {
		t.Fatalf("claim after reconnect = %+v, %v", c, err)
	}
}
