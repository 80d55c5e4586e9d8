package idempgx

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem/shared/migration"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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
// "create_records") and the Up and Down SQL. They use unqualified names: the Migrator runs them with
// search_path set to its schema.
type Migration = migration.Migration

// migrations is the parsed content of migration/, sorted by version.
var migrations = migration.MustLoad(migrationFS, "migration", "idempgx")

// Migrations returns the embedded migrations in version order.
func Migrations() []Migration { return append([]Migration(nil), migrations...) }

// LatestVersion is the version a fully migrated schema is at.
func LatestVersion() int { return len(migrations) }

// MigratorConfig configures a [Migrator]. A nil pointer means the defaults.
type MigratorConfig struct {
	// Schema holds the idem tables and the idem_migrations table. Default
	// "public". Up creates it if it does not exist.
	Schema string
}

// Migrator applies and reverts the embedded migrations in one schema.
// Concurrent migrators (for example several replicas starting at once) are
// safe: each step holds a transaction-level advisory lock for its schema.
type Migrator struct {
	pool   *pgxpool.Pool
	schema string
}

// NewMigrator returns a Migrator for the schema in cfg (nil = "public").
func NewMigrator(pool *pgxpool.Pool, cfg *MigratorConfig) (*Migrator, error) {
	if pool == nil {
		return nil, errors.New("idempgx: nil pool")
	}
	schema := "public"
	if cfg != nil && cfg.Schema != "" {
		schema = cfg.Schema
	}
	return &Migrator{pool: pool, schema: schema}, nil
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

// Up applies every pending migration, each in its own transaction, and
// returns the versions it applied (none when the schema is up to date).
func (m *Migrator) Up(ctx context.Context) (MigrateResult, error) {
	return m.run(ctx, DirectionUp, len(migrations))
}

// Down reverts up to steps applied migrations, newest first, each in its own
// transaction, and returns the versions it reverted. steps must be
// positive; a larger steps than applied migrations reverts them all.
func (m *Migrator) Down(ctx context.Context, steps int) (MigrateResult, error) {
	if steps <= 0 {
		return MigrateResult{}, fmt.Errorf("idempgx: down: steps must be positive, got %d", steps)
	}
	return m.run(ctx, DirectionDown, steps)
}

// run moves up to steps migrations in direction dir, one transaction each,
// and stops early when there is nothing left to do.
func (m *Migrator) run(ctx context.Context, dir Direction, steps int) (MigrateResult, error) {
	var res MigrateResult
	for range steps {
		moved := 0
		err := m.step(ctx, func(ctx context.Context, tx pgx.Tx, current int) error {
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
				record = "INSERT INTO " + m.table("idem_migrations") + " (version, name) VALUES ($1, $2)"
			case dir == DirectionDown && current > 0:
				mig = migrations[current-1]
				body, args = mig.Down, []any{mig.Version}
				record = "DELETE FROM " + m.table("idem_migrations") + " WHERE version = $1"
			default:
				return nil
			}
			if _, err := tx.Exec(ctx, body); err != nil {
				return fmt.Errorf("idempgx: migrate %s %d (%s): %w", dir, mig.Version, mig.Name, classify(err))
			}
			if _, err := tx.Exec(ctx, record, args...); err != nil {
				return fmt.Errorf("idempgx: record migration %s %d: %w", dir, mig.Version, classify(err))
			}
			moved = mig.Version
			return nil
		})
		if err != nil {
			return res, err
		}
		if moved == 0 {
			break
		}
		res.Versions = append(res.Versions, moved)
	}
	return res, nil
}

// step runs fn in one transaction that holds the schema's migration lock,
// with search_path set to the schema and the current version read under the
// lock, so that two migrators never apply the same migration.
func (m *Migrator) step(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx, current int) error) error {
	return pgx.BeginFunc(ctx, m.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", "idem-migrate:"+m.schema); err != nil {
			return fmt.Errorf("idempgx: migration lock: %w", classify(err))
		}
		schema := pgx.Identifier{m.schema}.Sanitize()
		// Only create a missing schema: CREATE SCHEMA IF NOT EXISTS needs the
		// CREATE privilege on the database even when the schema exists.
		var exists bool
		if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)", m.schema).Scan(&exists); err != nil {
			return fmt.Errorf("idempgx: look up schema %s: %w", m.schema, classify(err))
		}
		stmts := []string{"SET LOCAL search_path TO " + schema}
		if !exists {
			stmts = append([]string{"CREATE SCHEMA " + schema}, stmts...)
		}
		stmts = append(stmts,
			"CREATE TABLE IF NOT EXISTS "+m.table("idem_migrations")+` (
	version    integer     PRIMARY KEY,
	name       text        NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT now()
)`)
		for _, s := range stmts {
			if _, err := tx.Exec(ctx, s); err != nil {
				return fmt.Errorf("idempgx: prepare schema %s: %w", m.schema, classify(err))
			}
		}
		current, err := m.version(ctx, tx)
		if err != nil {
			return err
		}
		return fn(ctx, tx, current)
	})
}

func (m *Migrator) table(name string) string { return pgx.Identifier{m.schema, name}.Sanitize() }

// version returns the highest applied version, checking that the database
// is not ahead of this binary (a newer idem migrated it).
func (m *Migrator) version(ctx context.Context, q querier) (int, error) {
	var v int
	if err := q.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM "+m.table("idem_migrations")).Scan(&v); err != nil {
		return 0, fmt.Errorf("idempgx: read migration version: %w", classify(err))
	}
	if v > len(migrations) {
		return v, fmt.Errorf("idempgx: schema %s is at migration %d, newer than this build knows (%d); upgrade idem", m.schema, v, len(migrations))
	}
	return v, nil
}

// Version returns the schema's current migration version (0 when nothing
// was applied or the schema does not exist).
func (m *Migrator) Version(ctx context.Context) (int, error) {
	var exists bool
	if err := m.pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", m.table("idem_migrations")).Scan(&exists); err != nil {
		return 0, fmt.Errorf("idempgx: read migration version: %w", classify(err))
	}
	if !exists {
		return 0, nil
	}
	return m.version(ctx, m.pool)
}

// Status lists every embedded migration and whether it is applied.
func (m *Migrator) Status(ctx context.Context) ([]MigrationStatus, error) {
	out := migration.Pending(migrations)
	var exists bool
	if err := m.pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", m.table("idem_migrations")).Scan(&exists); err != nil {
		return nil, fmt.Errorf("idempgx: migration status: %w", classify(err))
	}
	if !exists {
		return out, nil
	}
	rows, err := m.pool.Query(ctx, "SELECT version, applied_at FROM "+m.table("idem_migrations")+" ORDER BY version")
	if err != nil {
		return nil, fmt.Errorf("idempgx: migration status: %w", classify(err))
	}
	var (
		version int
		at      time.Time
	)
	_, err = pgx.ForEachRow(rows, []any{&version, &at}, func() error {
		migration.MarkApplied(out, version, at)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("idempgx: migration status: %w", classify(err))
	}
	return out, nil
}

// SQL returns the SQL of one migration, for teams that apply schema changes
// with their own tools. The statements use unqualified names; run them with
// search_path set to the target schema, and record the version yourself.
func SQL(direction Direction, version int) (string, error) {
	q, err := migration.SQL(migrations, direction, version)
	if err != nil {
		return "", fmt.Errorf("idempgx: %w", err)
	}
	return q, nil
}

// SQL returns the SQL of one migration; see the package-level [SQL].
func (m *Migrator) SQL(direction Direction, version int) (string, error) {
	return SQL(direction, version)
}
