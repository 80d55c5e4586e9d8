package idemsqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/idem-go/idem"

	// The pure-Go driver: go install needs no C toolchain.
	_ "modernc.org/sqlite"
)

// DriverName is the database/sql driver this package registers and opens.
const DriverName = "sqlite"

// busyTimeoutMillis is how long a connection waits for another writer
// before giving up with SQLITE_BUSY. Writes are short, so this only runs out
// under pathological contention; such an error is marked retryable.
const busyTimeoutMillis = 10000

// ParseDSN returns the file path of a store DSN: "sqlite://path/to/file.db"
// (relative), "sqlite:///abs/file.db" (absolute) or a plain path. In-memory
// databases are refused: they lose every record at restart, and each pooled
// connection would see a different one.
func ParseDSN(dsn string) (string, error) {
	path := dsn
	if rest, ok := strings.CutPrefix(dsn, "sqlite://"); ok {
		path = rest
	} else if i := strings.Index(dsn, "://"); i >= 0 {
		return "", fmt.Errorf("%w: idemsqlite: DSN %q: scheme must be sqlite://", idem.ErrInvalidConfig, dsn)
	}
	switch {
	case path == "":
		return "", fmt.Errorf("%w: idemsqlite: DSN %q has no file path", idem.ErrInvalidConfig, dsn)
	case path == ":memory:" || strings.HasPrefix(path, "file:") || strings.Contains(path, "mode=memory"):
		return "", fmt.Errorf("%w: idemsqlite: DSN %q: give a file path (in-memory databases are not durable)", idem.ErrInvalidConfig, dsn)
	case strings.ContainsRune(path, 0):
		return "", fmt.Errorf("%w: idemsqlite: DSN has a NUL byte", idem.ErrInvalidConfig)
	}
	return path, nil
}

// driverDSN turns a file path into the driver's URI with the settings every
// store connection needs: WAL so readers never block the writer,
// busy_timeout so a writer waits for the lock instead of failing, foreign
// keys on, synchronous=FULL so a committed dedupe record survives power loss,
// and BEGIN IMMEDIATE for every transaction so that a transaction that reads
// and then writes can never fail on lock upgrade.
func driverDSN(path string) string {
	escaped := strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(path)
	return "file:" + escaped +
		fmt.Sprintf("?_pragma=busy_timeout(%d)", busyTimeoutMillis) +
		"&_pragma=journal_mode(WAL)&_pragma=foreign_keys(1)&_pragma=synchronous(FULL)&_txlock=immediate"
}

// OpenDB opens the SQLite database of dsn (see [ParseDSN]) with the settings
// the store needs and checks that it can be reached. It neither migrates nor
// checks migrations: the CLI's migrate command uses it with [NewMigrator].
// The caller closes the returned *sql.DB.
func OpenDB(ctx context.Context, dsn string) (*sql.DB, error) {
	path, err := ParseDSN(dsn)
	if err != nil {
		return nil, err
	}
	db, err := sql.Open(DriverName, driverDSN(path))
	if err != nil {
		return nil, fmt.Errorf("idemsqlite: open %s: %w", path, err)
	}
	// WAL gives one writer at a time anyway; a few connections let readers
	// (Get, replays) proceed beside it without a large idle pool of file
	// handles.
	db.SetMaxOpenConns(8)
	db.SetMaxIdleConns(8)
	if err := db.PingContext(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("idemsqlite: open %s: %w", path, classify(err)), db.Close())
	}
	return db, nil
}
