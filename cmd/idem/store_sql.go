package main

import (
	"context"
	"errors"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/shared/migration"
)

// sqlBackend is the one shape of the CLI's SQL store adapters (PostgreSQL,
// SQLite): a database handle (a pool, a *sql.DB), a store built over it
// without I/O and then pinged, and the store's migrator over the same kind
// of handle. Each adapter fills in what differs.
type sqlBackend[DB any] struct {
	backend
	// connect opens the database handle and returns how to close it;
	// forMigrations asks for one sized for migrations.
	connect func(ctx context.Context, cfg storeConfig, forMigrations bool) (DB, func() error, error)
	// store builds the store over db (no I/O).
	store func(db DB, cfg storeConfig) (sqlStore, error)
	// migrator builds the migrator over db (no I/O).
	migrator func(db DB, cfg storeConfig) (migration.Migrator, error)
	// notMigrated describes the schema's version when err says it is not
	// migrated.
	notMigrated func(err error) (detail string, ok bool)
	// explain turns any other failure to open or ping into what the user
	// should check; nil leaves it as it is.
	explain func(cfg storeConfig, err error) error
}

// sqlStore is a store with a Ping: the database answers and its schema is
// migrated.
type sqlStore interface {
	idem.Store
	Ping(ctx context.Context) error
}

// registerSQLBackend registers b with its Open and Migrator.
func registerSQLBackend[DB any](b sqlBackend[DB]) {
	b.Open = b.open
	b.Migrator = b.openMigrator
	registerBackend(b.backend)
}

// open connects, builds the store and pings it, so commands fail before
// they do anything.
func (b sqlBackend[DB]) open(ctx context.Context, cfg storeConfig) (idem.Store, func() error, error) {
	db, closeDB, err := b.connect(ctx, cfg, false)
	if err != nil {
		return nil, nil, err
	}
	s, err := b.store(db, cfg)
	if err == nil {
		err = s.Ping(ctx)
	}
	if err != nil {
		_ = closeDB()
		if detail, ok := b.notMigrated(err); ok {
			return nil, nil, notMigratedError(&b.backend, cfg, detail)
		}
		if b.explain != nil {
			err = b.explain(cfg, err)
		}
		return nil, nil, err
	}
	closeFn := closeDB
	if c, ok := s.(interface{ Close() error }); ok {
		closeFn = func() error { return errors.Join(c.Close(), closeDB()) }
	}
	return s, closeFn, nil
}

func (b sqlBackend[DB]) openMigrator(ctx context.Context, cfg storeConfig) (migration.Migrator, func() error, error) {
	db, closeDB, err := b.connect(ctx, cfg, true)
	if err != nil {
		return nil, nil, err
	}
	m, err := b.migrator(db, cfg)
	if err != nil {
		return nil, nil, errors.Join(err, closeDB())
	}
	return m, closeDB, nil
}
