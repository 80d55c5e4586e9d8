package idemmysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"fmt"
	"strings"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/shared/migration"
)

//go:embed migration/*.sql
var migrationFS embed.FS

// Direction says which way a migration runs.
type Direction = migration.Direction

const (
	// DirectionUp applies a migration.
	DirectionUp = migration.Up
	// DirectionDown reverts a migration.
	DirectionDown = migration.Down
)

// Migration is one embedded, numbered schema change: its Version (applied
// in order), its Name (the descriptive part of the file name, e.g.
// "create_records") and the Up and Down SQL. They use unqualified names: the
// Migrator runs them in the database its *sql.DB connects to.
type Migration = migration.Migration

// migrations is the parsed content of migration/, sorted by version.
var migrations = migration.MustLoad(migrationFS, "migration", "idemmysql")

// Migrations returns the embedded migrations in version order.
func Migrations() []Migration { return append([]Migration(nil), migrations...) }

// LatestVersion is the version a fully migrated database is at.
func LatestVersion() int { return len(migrations) }

// MigrationStatus is one migration and whether it is applied (the type
// every SQL store and the CLI share).
type MigrationStatus = migration.Status

// MigrateResult lists the versions a call applied or reverted, in the order
// it did so (the type every SQL store and the CLI share).
type MigrateResult = migration.Result

// Migrator satisfies the interface the CLI drives every SQL store's
// migrations through.
var _ migration.Migrator = (*Migrator)(nil)

// Migrator applies and reverts the embedded migrations in the database of
// its *sql.DB. Concurrent migrators (several replicas starting at once) are
// safe: each call holds the database's named lock (GET_LOCK) while it reads
// the version and moves it.
//
// MySQL and MariaDB commit every DDL statement at once, so a migration is
// not one transaction: if one fails halfway, the statements before the
// failure stay applied and the version is not recorded. The up files create
// with IF NOT EXISTS and the down files drop with IF EXISTS, so running
// `up` (or `down`) again after fixing the cause completes it.
type Migrator struct {
	db *sql.DB
}

// NewMigrator returns a Migrator over db.
func NewMigrator(db *sql.DB) (*Migrator, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: idemmysql: nil *sql.DB", idem.ErrInvalidConfig)
	}
	return &Migrator{db: db}, nil
}

// lockWaitSeconds bounds how long a migrator waits for another one.
const lockWaitSeconds = 60

const createMigrationsTable = `CREATE TABLE IF NOT EXISTS idem_migrations (
    version    INT          NOT NULL PRIMARY KEY,
    name       VARCHAR(255) NOT NULL,
    applied_at DATETIME(6)  NOT NULL
) ENGINE = InnoDB`

// Up applies every pending migration and returns the versions it applied
// (none when the database is up to date).
func (m *Migrator) Up(ctx context.Context) (MigrateResult, error) {
	return m.run(ctx, DirectionUp, len(migrations))
}

// Down reverts up to steps applied migrations, newest first, and returns the
// versions it reverted. steps must be positive; a larger steps than applied
// migrations reverts them all.
func (m *Migrator) Down(ctx context.Context, steps int) (MigrateResult, error) {
	if steps <= 0 {
		return MigrateResult{}, fmt.Errorf("idemmysql: down: steps must be positive, got %d", steps)
	}
	return m.run(ctx, DirectionDown, steps)
}

// run moves up to steps migrations in direction dir under the migration
// lock, and stops early when there is nothing left to do.
func (m *Migrator) run(ctx context.Context, dir Direction, steps int) (res MigrateResult, err error) {
	err = m.locked(ctx, func(conn *sql.Conn) error {
		if err := checkServer(ctx, conn); err != nil {
			return err
		}
		if _, err := conn.ExecContext(ctx, createMigrationsTable); err != nil {
			return wrapErr("migrate: create idem_migrations", err)
		}
		current, err := queryVersion(ctx, conn)
		if err != nil {
			return err
		}
		for range steps {
			var (
				mig    Migration
				body   string
				record string
				args   []any
			)
			switch {
			case dir == DirectionUp && current < len(migrations):
				mig = migrations[current]
				body, args = mig.Up, []any{mig.Version, mig.Name}
				record = "INSERT INTO idem_migrations (version, name, applied_at) VALUES (?, ?, " + nowSQL + ")"
				current++
			case dir == DirectionDown && current > 0:
				mig = migrations[current-1]
				body, args = mig.Down, []any{mig.Version}
				record = "DELETE FROM idem_migrations WHERE version = ?"
				current--
			default:
				return nil
			}
			for _, stmt := range statements(body) {
				if _, err := conn.ExecContext(ctx, stmt); err != nil {
					return fmt.Errorf("idemmysql: migrate %s %d (%s): %w", dir, mig.Version, mig.Name, classify(err))
				}
			}
			if _, err := conn.ExecContext(ctx, record, args...); err != nil {
				return fmt.Errorf("idemmysql: record migration %s %d: %w", dir, mig.Version, classify(err))
			}
			res.Versions = append(res.Versions, mig.Version)
		}
		return nil
	})
	return res, err
}

// locked runs fn on one connection that holds the database's migration
// lock. The lock is released, or the connection closed, before it returns.
func (m *Migrator) locked(ctx context.Context, fn func(conn *sql.Conn) error) (err error) {
	conn, err := m.db.Conn(ctx)
	if err != nil {
		return wrapErr("migrate: connect", err)
	}
	defer conn.Close()
	const name = "CONCAT('idem_migrate_', SHA1(DATABASE()))" // at most 64 characters
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK("+name+", ?)", lockWaitSeconds).Scan(&got); err != nil {
		return wrapErr("migrate: lock", err)
	}
	if got.Int64 != 1 {
		return idem.Retryable(fmt.Errorf("idemmysql: migrate: another migrator held the lock for %ds", lockWaitSeconds))
	}
	defer func() {
		if _, rerr := conn.ExecContext(context.WithoutCancel(ctx), "SELECT RELEASE_LOCK("+name+")"); rerr != nil {
			// A connection that may still hold the lock must not go back to
			// the pool: closing it releases the lock.
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		}
	}()
	return fn(conn)
}

// statements splits a migration file into statements: each ends with a
// semicolon at the end of a line. The driver runs one statement per call
// unless the DSN sets multiStatements, which the store does not require.
func statements(body string) []string {
	var out []string
	var cur strings.Builder
	for line := range strings.Lines(body) {
		cur.WriteString(line)
		if strings.HasSuffix(strings.TrimSpace(line), ";") {
			if s := strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(cur.String()), ";")); !onlyComments(s) {
				out = append(out, s)
			}
			cur.Reset()
		}
	}
	if s := strings.TrimSpace(cur.String()); !onlyComments(s) {
		out = append(out, s)
	}
	return out
}

// onlyComments reports a text with nothing but "--" comment lines.
func onlyComments(s string) bool {
	for line := range strings.Lines(s) {
		if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "--") {
			return false
		}
	}
	return true
}

// queryVersion returns the highest applied version, refusing a database a
// newer idem migrated further than this build knows.
func queryVersion(ctx context.Context, q execer) (int, error) {
	var v int
	if err := q.QueryRowContext(ctx, "SELECT COALESCE(MAX(version), 0) FROM idem_migrations").Scan(&v); err != nil {
		return 0, wrapErr("read migration version", err)
	}
	if v > len(migrations) {
		return v, fmt.Errorf("idemmysql: the database is at migration %d, newer than this build knows (%d); upgrade idem", v, len(migrations))
	}
	return v, nil
}

func migrationsTableExists(ctx context.Context, q execer) (bool, error) {
	var n int
	err := q.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = 'idem_migrations'").Scan(&n)
	if err != nil {
		return false, wrapErr("read migration version", err)
	}
	return n > 0, nil
}

// Version returns the database's current migration version (0 when nothing
// was applied).
func (m *Migrator) Version(ctx context.Context) (int, error) {
	ok, err := migrationsTableExists(ctx, m.db)
	if err != nil || !ok {
		return 0, err
	}
	return queryVersion(ctx, m.db)
}

// Status lists every embedded migration and whether it is applied.
func (m *Migrator) Status(ctx context.Context) ([]MigrationStatus, error) {
	out := migration.Pending(migrations)
	ok, err := migrationsTableExists(ctx, m.db)
	if err != nil || !ok {
		return out, err
	}
	rows, err := m.db.QueryContext(ctx, "SELECT version, applied_at FROM idem_migrations ORDER BY version")
	if err != nil {
		return nil, wrapErr("migration status", err)
	}
	err = eachRow(rows, func(r *sql.Rows) error {
		var (
			version int
			at      dbTime
		)
		if err := r.Scan(&version, &at); err != nil {
			return err
		}
		migration.MarkApplied(out, version, at.time())
		return nil
	})
	if err != nil {
		return nil, wrapErr("migration status", err)
	}
	return out, nil
}

// SQL returns the SQL of one migration, for teams that apply schema changes
// with their own tools: run it in the target database, and record the
// version in idem_migrations yourself, or the store will report the database
// as not migrated.
func SQL(direction Direction, version int) (string, error) {
	q, err := migration.SQL(migrations, direction, version)
	if err != nil {
		return "", fmt.Errorf("idemmysql: %w", err)
	}
	return q, nil
}

// SQL returns the SQL of one migration; see the package-level [SQL].
func (m *Migrator) SQL(direction Direction, version int) (string, error) {
	return SQL(direction, version)
}
