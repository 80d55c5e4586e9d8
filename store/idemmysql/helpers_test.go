package idemmysql_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/store/idemmysql"
	"go.uber.org/goleak"
)

// databaseURL returns IDEM_MYSQL_URL (a mysql:// URL or a driver DSN),
// skipping the test without it locally and failing it under CI, where the
// server must be there.
func databaseURL(tb testing.TB) string {
	tb.Helper()
	return idemtest.ServiceURL(tb, "IDEM_MYSQL_URL")
}

// driverConfig parses IDEM_MYSQL_URL.
func driverConfig(tb testing.TB) *mysql.Config {
	tb.Helper()
	raw := databaseURL(tb)
	var (
		cfg *mysql.Config
		err error
	)
	if strings.Contains(raw, "://") {
		cfg, err = idemmysql.ParseURL(raw)
	} else {
		cfg, err = mysql.ParseDSN(raw)
	}
	if err != nil {
		tb.Fatalf("IDEM_MYSQL_URL: %v", err)
	}
	return cfg
}

var (
	adminOnce sync.Once
	admin     *sql.DB
	adminErr  error
)

// adminDB is one pool shared by the package's tests for creating and
// dropping their databases.
func adminDB(tb testing.TB) *sql.DB {
	tb.Helper()
	cfg := driverConfig(tb)
	adminOnce.Do(func() {
		c, err := mysql.NewConnector(cfg)
		if err != nil {
			adminErr = err
			return
		}
		admin = sql.OpenDB(c)
		admin.SetMaxOpenConns(4)
		adminErr = admin.Ping()
	})
	if adminErr != nil {
		tb.Fatalf("connect to %s: %v", cfg.Addr, adminErr)
	}
	return admin
}

// TestMain closes the shared pool, then fails the package when a test left
// a goroutine running.
func TestMain(m *testing.M) {
	code := m.Run()
	if admin != nil {
		_ = admin.Close()
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

func randomSuffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// newDB creates an empty, uniquely named database, dropped at cleanup, and
// returns a pool over it (maxConns connections).
func newDB(tb testing.TB, maxConns int) *sql.DB {
	tb.Helper()
	a := adminDB(tb)
	name := "idemtest_" + randomSuffix()
	if _, err := a.Exec("CREATE DATABASE " + name); err != nil {
		tb.Fatalf("create database: %v", err)
	}
	cfg := driverConfig(tb)
	cfg.DBName = name
	c, err := mysql.NewConnector(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	db := sql.OpenDB(c)
	db.SetMaxOpenConns(maxConns)
	tb.Cleanup(func() {
		_ = db.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := a.ExecContext(ctx, "DROP DATABASE "+name); err != nil {
			tb.Errorf("drop database %s: %v", name, err)
		}
	})
	return db
}

// migratedDB is newDB with the idem migrations applied.
func migratedDB(tb testing.TB, maxConns int) *sql.DB {
	tb.Helper()
	db := newDB(tb, maxConns)
	m, err := idemmysql.NewMigrator(db)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := m.Up(context.Background()); err != nil {
		tb.Fatalf("migrate up: %v", err)
	}
	return db
}

// newStore returns a store over a fresh migrated database. cfg may be nil.
func newStore(tb testing.TB, cfg *idemmysql.Config) *idemmysql.Store {
	tb.Helper()
	s, err := idemmysql.New(migratedDB(tb, 16), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

func ctxT(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	tb.Cleanup(cancel)
	return ctx
}

// newDBOrNil is a *sql.DB that no test connects with: New does no I/O.
func newDBOrNil(tb testing.TB) *sql.DB {
	c, _ := mysql.NewConnector(mysql.NewConfig())
	db := sql.OpenDB(c)
	tb.Cleanup(func() { _ = db.Close() })
	return db
}
