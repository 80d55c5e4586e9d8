package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/shared/migration"
	"github.com/idem-go/idem/store/idemsqlite"
)

// sqliteBackend is the SQLite adapter: one *sql.DB over the file, for
// the store and for migrations alike.
var sqliteBackend = sqlBackend[*sql.DB]{
	backend: backend{
		Name:       "SQLite",
		Schemes:    []string{"sqlite"},
		Example:    "sqlite://PATH",
		Migrations: idemsqlite.Migrations,
		Vacuum:     vacuumSQLite,
	},
	connect: func(ctx context.Context, cfg storeConfig, _ bool) (*sql.DB, func() error, error) {
		path, err := sqlitePath(cfg)
		if err != nil {
			return nil, nil, err
		}
		db, err := idemsqlite.OpenDB(ctx, cfg.DSN)
		if err != nil {
			return nil, nil, sqliteOpenError(path, err)
		}
		return db, db.Close, nil
	},
	store: func(db *sql.DB, _ storeConfig) (sqlStore, error) {
		return idemsqlite.New(db, nil)
	},
	migrator: func(db *sql.DB, _ storeConfig) (migration.Migrator, error) {
		return idemsqlite.NewMigrator(db)
	},
	notMigrated: func(err error) (string, bool) {
		var nm *idemsqlite.NotMigratedError
		if !errors.As(err, &nm) {
			return "", false
		}
		return fmt.Sprintf("at version %d of %d", nm.Version, nm.Latest), true
	},
	explain: func(cfg storeConfig, err error) error {
		path, _ := idemsqlite.ParseDSN(cfg.DSN)
		return sqliteOpenError(path, err)
	},
}

func init() { registerSQLBackend(sqliteBackend) }

// sqlitePath returns the file of cfg.DSN. Unless cfg.Create is set, the
// file must exist: a mistyped path is reported rather than silently becoming
// a new, empty database.
func sqlitePath(cfg storeConfig) (string, error) {
	path, err := idemsqlite.ParseDSN(cfg.DSN)
	if err != nil {
		return "", fmt.Errorf("invalid --store: %s", strings.TrimPrefix(err.Error(), idem.ErrInvalidConfig.Error()+": idemsqlite: "))
	}
	if cfg.Create {
		return path, nil
	}
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("no SQLite database at %s; create it with: %s", path, migrateUpCommand(cfg))
	} else if err != nil {
		return "", fmt.Errorf("SQLite database %s: %w", path, err)
	}
	return path, nil
}

// sqliteOpenError explains a database that exists but cannot be used.
func sqliteOpenError(path string, err error) error {
	msg := strings.TrimPrefix(err.Error(), "idemsqlite: open "+path+": ")
	return fmt.Errorf("cannot open SQLite database %s: %s; check that the path is an idem SQLite file you may read and write", path, msg)
}
