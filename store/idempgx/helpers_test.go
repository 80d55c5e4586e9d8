package idempgx_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/idemtest"

	"github.com/idem-go/idem/store/idempgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"
)

var (
	poolOnce sync.Once
	pool     *pgxpool.Pool
	poolErr  error
)

// databaseURL returns IDEM_POSTGRES_URL, skipping the test without it
// locally and failing it under CI, where the server must be there.
func databaseURL(tb testing.TB) string {
	tb.Helper()
	return idemtest.ServiceURL(tb, "IDEM_POSTGRES_URL")
}

// testPool is one pool shared by the package's tests; each test isolates
// itself in its own schema.
func testPool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	url := databaseURL(tb)
	poolOnce.Do(func() {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			poolErr = err
			return
		}
		cfg.MaxConns = 24
		pool, poolErr = pgxpool.NewWithConfig(context.Background(), cfg)
	})
	if poolErr != nil {
		tb.Fatalf("connect to %s: %v", url, poolErr)
	}
	return pool
}

// TestMain closes the shared pool, then fails the package when a test left
// a goroutine running (a worker, a heartbeat, a batch in flight).
func TestMain(m *testing.M) {
	code := m.Run()
	if pool != nil {
		pool.Close()
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

// newSchema creates an empty, uniquely named schema dropped at cleanup.
func newSchema(tb testing.TB) string {
	tb.Helper()
	p := testPool(tb)
	name := "idemtest_" + randomSuffix()
	ctx := context.Background()
	if _, err := p.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize()); err != nil {
		tb.Fatalf("create schema: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := p.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{name}.Sanitize()+" CASCADE"); err != nil {
			tb.Errorf("drop schema %s: %v", name, err)
		}
	})
	return name
}

// migratedSchema is newSchema with the idem migrations applied.
func migratedSchema(tb testing.TB) string {
	tb.Helper()
	schema := newSchema(tb)
	m, err := idempgx.NewMigrator(testPool(tb), &idempgx.MigratorConfig{Schema: schema})
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := m.Up(context.Background()); err != nil {
		tb.Fatalf("migrate up: %v", err)
	}
	return schema
}

// newStore returns a store over a fresh migrated schema. cfg may be nil.
func newStore(tb testing.TB, cfg *idempgx.Config) *idempgx.Store {
	tb.Helper()
	schema := migratedSchema(tb)
	c := idempgx.Config{}
	if cfg != nil {
		c = *cfg
	}
	c.Schema = schema
	s, err := idempgx.New(testPool(tb), &c)
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

// qualified names a table in the store's schema.
func qualified(s *idempgx.Store, table string) string {
	return pgx.Identifier{s.Config().Schema, table}.Sanitize()
}
