package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idemsqlite"
)

func init() {
	registerBackend(backend{
		Name:       "SQLite",
		Schemes:    []string{"sqlite"},
		Example:    "sqlite://PATH",
		Open:       openSQLite,
		Migrator:   openSQLiteMigrator,
		Migrations: sqliteMigrations,
	})
}

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

func openSQLite(ctx context.Context, cfg storeConfig) (idem.Store, func() error, error) {
	path, err := sqlitePath(cfg)
	if err != nil {
		return nil, nil, err
	}
	s, err := idemsqlite.Open(ctx, cfg.DSN, nil)
	if err != nil {
		var nm *idemsqlite.NotMigratedError
		if errors.As(err, &nm) {
			return nil, nil, notMigratedError(backends["sqlite"], cfg, fmt.Sprintf("at version %d of %d", nm.Version, nm.Latest))
		}
		return nil, nil, sqliteOpenError(path, err)
	}
	return s, s.Close, nil
}

func openSQLiteMigrator(ctx context.Context, cfg storeConfig) (migrator, func() error, error) {
	path, err := sqlitePath(cfg)
	if err != nil {
		return nil, nil, err
	}
	db, err := idemsqlite.OpenDB(ctx, cfg.DSN)
	if err != nil {
		return nil, nil, sqliteOpenError(path, err)
	}
	m, err := idemsqlite.NewMigrator(db)
	if err != nil {
		return nil, nil, errors.Join(err, db.Close())
	}
	return sqliteMigrator{m}, db.Close, nil
}

type sqliteMigrator struct{ m *idemsqlite.Migrator }

func (s sqliteMigrator) Up(ctx context.Context) ([]int, error) {
	res, err := s.m.Up(ctx)
	return res.Versions, err
}

func (s sqliteMigrator) Down(ctx context.Context, steps int) ([]int, error) {
	res, err := s.m.Down(ctx, steps)
	return res.Versions, err
}

func (s sqliteMigrator) Status(ctx context.Context) ([]migrationStatus, error) {
	st, err := s.m.Status(ctx)
	out := make([]migrationStatus, len(st))
	for i, m := range st {
		out[i] = migrationStatus{Version: m.Version, Name: m.Name, Applied: m.Applied, AppliedAt: m.AppliedAt}
	}
	return out, err
}

func sqliteMigrations() []migrationSQL {
	ms := idemsqlite.Migrations()
	out := make([]migrationSQL, len(ms))
	for i, m := range ms {
		out[i] = migrationSQL{Version: m.Version, Name: m.Name, Up: m.Up, Down: m.Down}
	}
	return out
}
