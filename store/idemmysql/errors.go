package idemmysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"

	"github.com/go-sql-driver/mysql"
	"github.com/idem-go/idem"
)

// ErrNotMigrated reports a database whose migrations are not (all) applied.
// The error returned by [Store.Ping] is a [*NotMigratedError] that wraps it.
var ErrNotMigrated = errors.New("idemmysql: database is not migrated")

// NotMigratedError says which database is behind and by how much.
type NotMigratedError struct {
	Database string
	Version  int // the applied version
	Want     int // the version this build needs
}

func (e *NotMigratedError) Error() string {
	return fmt.Sprintf("idem: mysql database %s is not migrated (at version %d, want %d); run `idem migrate up --store mysql://…`",
		e.Database, e.Version, e.Want)
}

// Unwrap makes errors.Is(err, ErrNotMigrated) true.
func (e *NotMigratedError) Unwrap() error { return ErrNotMigrated }

// Server error numbers the store looks at.
const (
	erDupEntry              = 1062 // ER_DUP_ENTRY: the unique key serialised a concurrent insert
	erNoSuchTable           = 1146 // ER_NO_SUCH_TABLE
	erLockWaitTimeout       = 1205 // ER_LOCK_WAIT_TIMEOUT
	erLockDeadlock          = 1213 // ER_LOCK_DEADLOCK: the transaction was rolled back
	erConCount              = 1040 // ER_CON_COUNT_ERROR: too many connections
	erServerShutdown        = 1053 // ER_SERVER_SHUTDOWN
	erQueryInterrupted      = 1317 // ER_QUERY_INTERRUPTED (KILL QUERY, shutdown)
	erOptionPreventsStmt    = 1290 // ER_OPTION_PREVENTS_STATEMENT: --read-only (a replica after failover)
	erReadOnlyTransaction   = 1792 // ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION
	erReadOnlyMode          = 1836 // ER_READ_ONLY_MODE
	erConnectionKilled      = 1927 // MariaDB ER_CONNECTION_KILLED
	erClientInteractionTime = 4031 // MySQL ER_CLIENT_INTERACTION_TIMEOUT: disconnected by the server
	erLockNowait            = 3572 // MySQL ER_LOCK_NOWAIT
	erLockDeadlockGalera    = 1180 // ER_ERROR_DURING_COMMIT (Galera certification failure)
)

// retryableErrors are server errors after which the same operation may
// succeed: deadlocks and lock wait timeouts, a server that is shutting down,
// overloaded or killed the connection, and a server that became read-only
// (a failover in progress: the next connection may reach the new primary).
var retryableErrors = map[uint16]bool{
	erLockDeadlock:          true,
	erLockWaitTimeout:       true,
	erConCount:              true,
	erServerShutdown:        true,
	erQueryInterrupted:      true,
	erOptionPreventsStmt:    true,
	erReadOnlyTransaction:   true,
	erReadOnlyMode:          true,
	erConnectionKilled:      true,
	erClientInteractionTime: true,
	erLockNowait:            true,
	erLockDeadlockGalera:    true,
}

// errNumber returns the server error number of err, or 0.
func errNumber(err error) uint16 {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

// isDeadlock reports an error after which the server rolled the whole
// transaction back and running it again may succeed.
func isDeadlock(err error) bool {
	n := errNumber(err)
	return n == erLockDeadlock || n == erLockDeadlockGalera
}

// IsRetryableError reports whether err is a transient infrastructure error
// as far as MySQL, MariaDB and the driver are concerned: deadlock (1213),
// lock wait timeout (1205), a lost or refused connection, a server shutting
// down or read-only after a failover. The store already marks such errors
// with [idem.Retryable]; this is the classifier it uses. Every other server
// error (a constraint, a syntax error, a missing table) is not retryable.
func IsRetryableError(err error) bool {
	if err == nil {
		return false
	}
	// The caller gave up; retrying with the same context cannot help.
	if errors.Is(err, context.Canceled) {
		return false
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return retryableErrors[me.Number]
	}
	if errors.Is(err, mysql.ErrInvalidConn) || errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrConnDone) ||
		errors.Is(err, mysql.ErrPktSync) || errors.Is(err, mysql.ErrPktSyncMul) {
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

// classify marks transient errors with idem.Retryable; the driver's error
// stays reachable with errors.As.
func classify(err error) error {
	if err == nil {
		return nil
	}
	if IsRetryableError(err) {
		return idem.Retryable(err)
	}
	return err
}
