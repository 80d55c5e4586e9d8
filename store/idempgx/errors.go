package idempgx

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"

	"github.com/idem-go/idem"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrNotMigrated reports a schema whose migrations are not (all) applied.
// The error returned by [Store.Ping] is a [*NotMigratedError] that wraps it.
var ErrNotMigrated = errors.New("idempgx: postgres schema is not migrated")

// NotMigratedError says which schema is behind and by how much.
type NotMigratedError struct {
	Schema  string
	Version int // the applied version
	Want    int // the version this build needs
}

func (e *NotMigratedError) Error() string {
	return fmt.Sprintf("idem: postgres schema %s is not migrated (at version %d, want %d); run `idem migrate up --store postgres://…`",
		e.Schema, e.Version, e.Want)
}

// Unwrap makes errors.Is(err, ErrNotMigrated) true.
func (e *NotMigratedError) Unwrap() error { return ErrNotMigrated }

// querier is what pgxpool.Pool, pgx.Conn and pgx.Tx have in common.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// retryableSQLStates are server errors after which the same operation may
// succeed: serialization failures and deadlocks (the transaction was rolled
// back), lost or refused connections, and a server shutting down or
// overloaded.
var retryableSQLStates = map[string]bool{
	"40001": true, // serialization_failure
	"40P01": true, // deadlock_detected
	"55P03": true, // lock_not_available
	"53300": true, // too_many_connections
	"57P01": true, // admin_shutdown (includes pg_terminate_backend)
	"57P02": true, // crash_shutdown
	"57P03": true, // cannot_connect_now
	"08000": true, // connection_exception
	"08003": true, // connection_does_not_exist
	"08006": true, // connection_failure
	"08001": true, // sqlclient_unable_to_establish_sqlconnection
	"08004": true, // sqlserver_rejected_establishment_of_sqlconnection
}

// IsRetryableError reports whether err is a transient infrastructure error
// as far as PostgreSQL and pgx are concerned. The store already marks such
// errors with [idem.Retryable]; this is the classifier it uses.
func IsRetryableError(err error) bool {
	if err == nil {
		return false
	}
	// The caller gave up; retrying with the same context cannot help, and
	// the caller knows it cancelled.
	if errors.Is(err, context.Canceled) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return retryableSQLStates[pgErr.Code]
	}
	if pgconn.SafeToRetry(err) || pgconn.Timeout(err) {
		return true
	}
	var connErr *pgconn.ConnectError
	if errors.As(err, &connErr) {
		return true
	}
	var netErr net.Error
	if errors.As(err, &netErr) {
		return true
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed)
}

// classify marks transient errors with idem.Retryable; the pgx error stays
// reachable with errors.As.
func classify(err error) error {
	if err == nil {
		return nil
	}
	if IsRetryableError(err) {
		return idem.Retryable(err)
	}
	return err
}
