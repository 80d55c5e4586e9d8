package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/idem-go/idem/shared/migration"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// postgresBackend is the PostgreSQL adapter: a pool sized for the store
// or for migrations.
var postgresBackend = sqlBackend[*pgxpool.Pool]{
	backend: backend{
		Name:       "PostgreSQL",
		Schemes:    []string{"postgres", "postgresql"},
		Example:    "postgres://USER@HOST:PORT/DB",
		Migrations: idempgx.Migrations,
		Schema:     true,
		Vacuum:     vacuumPostgres,
	},
	connect: func(ctx context.Context, cfg storeConfig, forMigrations bool) (*pgxpool.Pool, func() error, error) {
		maxConns := int32(pgStoreMaxConns)
		if forMigrations {
			maxConns = pgMigratorMaxConns
		}
		pool, err := openPool(ctx, cfg, maxConns)
		if err != nil {
			return nil, nil, err
		}
		return pool, func() error { pool.Close(); return nil }, nil
	},
	store: func(pool *pgxpool.Pool, cfg storeConfig) (sqlStore, error) {
		// Either layout: the plain table or the partitioned one (idem keys maintain --partition).
		partitioned, err := idempgx.IsPartitioned(context.Background(), pool, cfg.Schema)
		if err != nil {
			return nil, err
		}
		return idempgx.New(pool, &idempgx.Config{Schema: cfg.Schema, Partitioned: partitioned})
	},
	migrator: func(pool *pgxpool.Pool, cfg storeConfig) (migration.Migrator, error) {
		return idempgx.NewMigrator(pool, &idempgx.MigratorConfig{Schema: cfg.Schema})
	},
	notMigrated: func(err error) (string, bool) {
		var nm *idempgx.NotMigratedError
		if !errors.As(err, &nm) {
			return "", false
		}
		return fmt.Sprintf("schema %s at version %d of %d", nm.Schema, nm.Version, nm.Want), true
	},
}

func init() { registerSQLBackend(postgresBackend) }

// pgConnectTimeout bounds connecting when the DSN sets no connect_timeout,
// so a firewalled host fails in seconds instead of hanging the CLI.
const pgConnectTimeout = 10 * time.Second

// The pool sizes the CLI uses when the DSN sets no pool_max_conns.
const (
	// pgStoreMaxConns is for the stores commands open: idem proxy serves
	// many requests at once, and idempgx keeps a quarter of the pool for
	// lease holders (Config.HolderConns), so the 2 the CLI once forced left
	// the claims a single connection. pgxpool opens connections only when
	// statements need them, so a command that runs one statement at a time
	// (idem keys get) still opens one.
	pgStoreMaxConns = 16
	// pgMigratorMaxConns is for migrations, which run one at a time.
	pgMigratorMaxConns = 2
)

// openPool parses cfg.DSN and connects, turning the usual failures into one
// line that says what to check. maxConns sizes the pool unless the DSN
// sets pool_max_conns.
func openPool(ctx context.Context, cfg storeConfig, maxConns int32) (*pgxpool.Pool, error) {
	if ambiguousUserInfo(cfg.DSN) {
		return nil, fmt.Errorf("invalid --store %q: the URL's user info cannot be told from its host: percent-encode '/', '#', '?' and '@' in the user name and password (%%2F, %%23, %%3F, %%40); want postgres://USER[:PASSWORD]@HOST:PORT/DB", redactDSN(cfg.DSN))
	}
	pc, err := pgxpool.ParseConfig(cfg.DSN)
	if err != nil {
		return nil, fmt.Errorf("invalid --store %q: %s; want postgres://USER[:PASSWORD]@HOST:PORT/DB", redactDSN(cfg.DSN), pgCause(err))
	}
	if pc.ConnConfig.ConnectTimeout == 0 {
		pc.ConnConfig.ConnectTimeout = pgConnectTimeout
	}
	if !setsPoolMaxConns(cfg.DSN) {
		pc.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("invalid --store %q: %s", redactDSN(cfg.DSN), pgCause(err))
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, pgUnreachable(pc, err)
	}
	return pool, nil
}

// setsPoolMaxConns reports whether dsn sets pool_max_conns. pgxpool's
// parsed config cannot tell: it fills in its default and drops the
// parameter, so dsn is parsed again without the pool's part.
func setsPoolMaxConns(dsn string) bool {
	cc, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return false
	}
	_, ok := cc.RuntimeParams["pool_max_conns"]
	return ok
}

// pgUnreachable explains a failed connection.
func pgUnreachable(pc *pgxpool.Config, err error) error {
	cc := pc.ConnConfig
	return fmt.Errorf("cannot connect to PostgreSQL at %s:%d/%s as %s: %s; check that the server is running and that --store (IDEM_STORE) is right",
		cc.Host, cc.Port, cc.Database, cc.User, pgCause(err))
}

// pgCause digs the informative part out of a pgx error chain: the server's
// message, the network error, or the whole text.
func pgCause(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return fmt.Sprintf("%s (SQLSTATE %s)", pgErr.Message, pgErr.Code)
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Err != nil {
		return opErr.Err.Error()
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "timed out"
	}
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		// Its text quotes the connection string, redacted only as well as
		// pgx can; the caller shows ours.
		bare := *pe
		bare.ConnString = ""
		return strings.TrimPrefix(bare.Error(), "cannot parse ``: ")
	}
	return err.Error()
}
