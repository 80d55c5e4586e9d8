package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/shared/migration"
	"github.com/idem-go/idem/store/idemmysql"
)

// mysqlBackend is the MySQL / MariaDB adapter: a *sql.DB sized for the
// store or for migrations.
var mysqlBackend = sqlBackend[*sql.DB]{
	backend: backend{
		Name:       "MySQL",
		Schemes:    []string{"mysql", "mariadb"},
		Example:    "mysql://USER@HOST:PORT/DB",
		Migrations: idemmysql.Migrations,
	},
	connect: func(ctx context.Context, cfg storeConfig, forMigrations bool) (*sql.DB, func() error, error) {
		maxConns := mysqlStoreMaxConns
		if forMigrations {
			maxConns = mysqlMigratorMaxConns
		}
		db, err := openMySQL(ctx, cfg, maxConns)
		if err != nil {
			return nil, nil, err
		}
		return db, db.Close, nil
	},
	store: func(db *sql.DB, _ storeConfig) (sqlStore, error) {
		return idemmysql.New(db, nil)
	},
	migrator: func(db *sql.DB, _ storeConfig) (migration.Migrator, error) {
		return idemmysql.NewMigrator(db)
	},
	notMigrated: func(err error) (string, bool) {
		var nm *idemmysql.NotMigratedError
		if !errors.As(err, &nm) {
			return "", false
		}
		return fmt.Sprintf("database %s at version %d of %d", nm.Database, nm.Version, nm.Want), true
	},
}

func init() { registerSQLBackend(mysqlBackend) }

// The pool sizes the CLI uses: idem proxy serves many requests at once;
// migrations run one at a time.
const (
	mysqlStoreMaxConns    = 16
	mysqlMigratorMaxConns = 2
	// mysqlConnectTimeout bounds connecting when the URL sets no timeout,
	// so a firewalled host fails in seconds instead of hanging the CLI.
	mysqlConnectTimeout = 10 * time.Second
)

// openMySQL parses cfg.DSN (mysql://USER[:PASSWORD]@HOST[:PORT]/DB[?PARAMS])
// and connects, turning the usual failures into one line that says what
// to check and never shows the password.
func openMySQL(ctx context.Context, cfg storeConfig, maxConns int) (*sql.DB, error) {
	mc, err := idemmysql.ParseURL(cfg.DSN)
	if err != nil {
		return nil, fmt.Errorf("invalid --store %q: %s", redactDSN(cfg.DSN),
			strings.TrimPrefix(err.Error(), idem.ErrInvalidConfig.Error()+": idemmysql: "))
	}
	if mc.Timeout == 0 {
		mc.Timeout = mysqlConnectTimeout
	}
	connector, err := mysql.NewConnector(mc)
	if err != nil {
		return nil, fmt.Errorf("invalid --store %q: %s", redactDSN(cfg.DSN), err)
	}
	db := sql.OpenDB(connector)
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("cannot connect to MySQL at %s/%s as %s: %s; check that the server is running and that --store (IDEM_STORE) is right",
			mc.Addr, mc.DBName, mc.User, mysqlCause(err, mc.Passwd))
	}
	return db, nil
}

// mysqlCause digs the informative part out of a driver error: the server's
// message, the network error, or the whole text, with the password cut out
// should any layer ever quote it.
func mysqlCause(err error, password string) string {
	var msg string
	var me *mysql.MySQLError
	var opErr *net.OpError
	switch {
	case errors.As(err, &me):
		msg = fmt.Sprintf("%s (error %d)", me.Message, me.Number)
	case errors.As(err, &opErr) && opErr.Err != nil:
		msg = opErr.Err.Error()
	case errors.Is(err, context.DeadlineExceeded):
		msg = "timed out"
	default:
		msg = err.Error()
	}
	if password != "" {
		msg = strings.ReplaceAll(msg, password, "xxxxx")
	}
	return msg
}
