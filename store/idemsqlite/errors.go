package idemsqlite

import (
	"errors"
	"fmt"
	"strings"

	"github.com/idem-go/idem"
)

// ErrNotMigrated is wrapped by the error [Open] and [New] return when the
// database's schema is older than this build's migrations. Test with
// errors.Is; the error text tells the command that fixes it.
var ErrNotMigrated = errors.New("idem: sqlite store is not migrated")

// NotMigratedError says which database needs which migrations. It matches
// [ErrNotMigrated] with errors.Is.
type NotMigratedError struct {
	// Path is the database file ("" when unknown, e.g. an in-memory database).
	Path string
	// Version is the applied migration version, Latest the one this build needs.
	Version, Latest int
}

func (e *NotMigratedError) Error() string {
	return fmt.Sprintf("idem: sqlite store at %s is not migrated (at version %d of %d); run `idem migrate up --store sqlite://%s`",
		e.Path, e.Version, e.Latest, e.Path)
}

// Is makes errors.Is(err, ErrNotMigrated) true.
func (e *NotMigratedError) Is(target error) bool { return target == ErrNotMigrated }

// SQLite primary result codes that mean "another connection holds the lock".
const (
	sqliteBusy   = 5
	sqliteLocked = 6
)

// classify marks lock contention that busy_timeout did not absorb as
// retryable: nothing was recorded and the same call may succeed later.
func classify(err error) error {
	if err == nil {
		return nil
	}
	if isBusy(err) {
		return idem.Retryable(err)
	}
	return err
}

func isBusy(err error) bool {
	var coded interface{ Code() int }
	if errors.As(err, &coded) {
		switch coded.Code() & 0xff {
		case sqliteBusy, sqliteLocked:
			return true
		}
		return false
	}
	// Another driver behind a user's *sql.DB: fall back to SQLite's messages.
	msg := err.Error()
	return strings.Contains(msg, "database is locked") ||
		strings.Contains(msg, "database table is locked") ||
		strings.Contains(msg, "SQLITE_BUSY")
}
