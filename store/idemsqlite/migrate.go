package idemsqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"errors"
	"fmt"
	"time"

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
// "create_records") and the Up and Down SQL.
type Migration = migration.Migration

// migrations is the parsed content of migration/, sorted by version.
var migrations = migration.MustLoad(migrationFS, "migration", "idemsqlite")

// Migrations returns the embedded migrations in version order.
func Migrations() []Migration { return append([]Migration(nil), migrations...) }

// LatestVersion is the version a fully migrated database is at.
func LatestVersion() int { return len(migrations) }

// SQL returns the SQL of one migration, for teams that apply schema changes
// with their own tools (record the version in idem_migrations yourself, or
// the store will report the database as not migrated).
func SQL(direction Direction, version int) (string, error) {
	q, err := migration.SQL(migrations, direction, version)
	if err != nil {
		return "", fmt.Errorf("idemsqlite: %w", err)
	}
	return q, nil
}

// MigrationStatus is one migration and whether it is applied (the type
// every SQL store and the CLI share).
type MigrationStatus = migration.Status

// MigrateResult lists the versions a call applied or reverted, in the order
// it did so (the type every SQL store and the CLI share).
type MigrateResult = migration.Result

// Migrator satisfies the interface the CLI drives every SQL store's
// migrations through.
var _ migration.Migrator = (*Migrator)(nil)

// Migrator applies and reverts the embedded migrations of one database. Each
// step runs in its own BEGIN IMMEDIATE transaction, so concurrent migrators
// (several processes starting at once) apply every migration exactly once.
type Migrator struct {
	db *sql.DB
}

// NewMigrator returns a Migrator over db (for example from [OpenDB]).
func NewMigrator(db *sql.DB) (*Migrator, error) {
	if db == nil {
		return nil, errors.New("idemsqlite: nil *sql.DB")
	}
	return &Migrator{db: db}, nil
}

const createMigrationsTable = `CREATE TABLE IF NOT EXISTS idem_migrations (
    version    INTEGER PRIMARY KEY,
    name       TEXT    NOT NULL,
    applied_at INTEGER NOT NULL
)`

// Up applies every pending migration and returns the versions it applied
// (none when the database is up to date).
func (m *Migrator) Up(ctx context.Context) (MigrateResult, error) {
	var res MigrateResult
	for {
		applied := 0
		err := m.step(ctx, func(conn *sql.Conn, current int) error {
			if current >= len(migrations) {
				return nil
			}
			mig := migrations[current]
			if _, err := conn.ExecContext(ctx, mig.Up); err != nil {
				return fmt.Errorf("idemsqlite: apply migration %d (%s): %w", mig.Version, mig.Name, classify(err))
			}
			if _, err := conn.ExecContext(ctx, "INSERT INTO idem_migrations (version, name, applied_at) VALUES (?, ?, ?)",
				mig.Version, mig.Name, time.Now().UnixMicro()); err != nil {
				return fmt.Errorf("idemsqlite: record migration %d: %w", mig.Version, classify(err))
			}
			applied = mig.Version
			return nil
		})
		if err != nil || applied == 0 {
			return res, err
		}
		res.Versions = append(res.Versions, applied)
	}
}

// Down reverts up to steps applied migrations, newest first, and returns the
// versions it reverted. steps must be positive; `idem migrate down` passes 1.
func (m *Migrator) Down(ctx context.Context, steps int) (MigrateResult, error) {
	var res MigrateResult
	if steps <= 0 {
		return res, fmt.Errorf("idemsqlite: down: steps must be positive, got %d", steps)
	}
	for range steps {
		reverted := 0
		err := m.step(ctx, func(conn *sql.Conn, current int) error {
			if current == 0 {
				return nil
			}
			mig := migrations[current-1]
			if _, err := conn.ExecContext(ctx, mig.Down); err != nil {
				return fmt.Errorf("idemsqlite: revert migration %d (%s): %w", mig.Version, mig.Name, classify(err))
			}
			if _, err := conn.ExecContext(ctx, "DELETE FROM idem_migrations WHERE version = ?", mig.Version); err != nil {
				return fmt.Errorf("idemsqlite: unrecord migration %d: %w", mig.Version, classify(err))
			}
			reverted = mig.Version
			return nil
		})
		if err != nil {
			return res, err
		}
		if reverted == 0 {
			break
		}
		res.Versions = append(res.Versions, reverted)
	}
	return res, nil
}

// step runs fn inside an explicit BEGIN IMMEDIATE on one connection. The
// statement is explicit rather than left to the DSN because the Migrator may
// be handed a *sql.DB opened by someone else, and DDL after a read in a
// deferred transaction can fail on lock upgrade.
func (m *Migrator) step(ctx context.Context, fn func(conn *sql.Conn, current int) error) (err error) {
	conn, err := m.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("idemsqlite: migrate: %w", classify(err))
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return fmt.Errorf("idemsqlite: migrate: begin: %w", classify(err))
	}
	committed := false
	defer func() {
		if committed {
			return
		}
		if _, rerr := conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK"); rerr != nil {
			// Never hand a connection with an open transaction back to the pool.
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		}
	}()
	if _, err := conn.ExecContext(ctx, createMigrationsTable); err != nil {
		return fmt.Errorf("idemsqlite: migrate: create idem_migrations: %w", classify(err))
	}
	current, err := queryVersion(ctx, conn)
	if err != nil {
		return err
	}
	if err := fn(conn, current); err != nil {
		return err
	}
	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		return fmt.Errorf("idemsqlite: migrate: commit: %w", classify(err))
	}
	committed = true
	return nil
}

type queryRower interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// queryVersion returns the highest applied version, refusing a database a
// newer idem migrated further than this build knows.
func queryVersion(ctx context.Context, q queryRower) (int, error) {
	var v int
	if err := q.QueryRowContext(ctx, "SELECT coalesce(max(version), 0) FROM idem_migrations").Scan(&v); err != nil {
		return 0, fmt.Errorf("idemsqlite: read migration version: %w", classify(err))
	}
	if v > len(migrations) {
		return v, fmt.Errorf("idemsqlite: database is at migration %d, newer than this build knows (%d); upgrade idem", v, len(migrations))
	}
	return v, nil
}

func migrationsTableExists(ctx context.Context, q queryRower) (bool, error) {
	var n int
	err := q.QueryRowContext(ctx, "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'idem_migrations'").Scan(&n)
	if err != nil {
		return false, fmt.Errorf("idemsqlite: read migration version: %w", classify(err))
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
		return nil, fmt.Errorf("idemsqlite: migration status: %w", classify(err))
	}
	defer rows.Close()
	for rows.Next() {
		var version int
		var at int64
		if err := rows.Scan(&version, &at); err != nil {
			return nil, fmt.Errorf("idemsqlite: migration status: %w", err)
		}
		migration.MarkApplied(out, version, time.UnixMicro(at))
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("idemsqlite: migration status: %w", classify(err))
	}
	return out, nil
}

// SQL returns the SQL of one migration; see the package-level [SQL].
func (m *Migrator) SQL(direction Direction, version int) (string, error) {
	return SQL(direction, version)
}
