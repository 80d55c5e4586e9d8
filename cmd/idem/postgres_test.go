package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/idem-go/idem/idemtest"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// postgresURL returns IDEM_POSTGRES_URL; without it the test is skipped
// locally and fails in CI, where every backend must be exercised.
func postgresURL(t *testing.T) string {
	t.Helper()
	return idemtest.ServiceURL(t, "IDEM_POSTGRES_URL")
}

// testSchema returns a fresh schema name, dropped when the test ends. The
// CLI is pointed at it with --schema, so tests never touch public.
func testSchema(t *testing.T, url string) string {
	t.Helper()
	schema := fmt.Sprintf("idem_cli_test_%d_%08x", time.Now().UnixNano()%1e6, rand.Uint32())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	return schema
}

func TestKeysPostgres(t *testing.T) {
	t.Parallel()
	url := postgresURL(t)
	schema := testSchema(t, url)
	testKeysLifecycle(t, []string{"--store", url, "--schema", schema}, func(t *testing.T) idem.Store {
		pool, err := pgxpool.New(t.Context(), url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		s, err := idempgx.New(pool, &idempgx.Config{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// TestPostgresSchemaFromEnv: IDEM_SCHEMA selects the schema when --schema
// is absent, and the not-migrated error repeats it in the command to run.
func TestPostgresSchemaFromEnv(t *testing.T) {
	t.Parallel()
	url := postgresURL(t)
	schema := testSchema(t, url)
	env := map[string]string{"IDEM_STORE": url, "IDEM_SCHEMA": schema}
	wantExit(t, runCLI(t, env, "keys", "get", "k"), exitFailure, "not migrated", "schema "+schema, "--schema "+schema)
	wantExit(t, runCLI(t, env, "migrate", "up"), exitOK)
	wantExit(t, runCLI(t, env, "keys", "get", "k"), exitFailure, "not found")
}

func TestPostgresWrongDatabase(t *testing.T) {
	t.Parallel()
	url := postgresURL(t)
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	bad := fmt.Sprintf("postgres://%s@%s:%d/idem_no_such_db_%08x?sslmode=disable", cfg.User, cfg.Host, cfg.Port, rand.Uint32())
	wantExit(t, runCLI(t, nil, "keys", "get", "k", "--store", bad), exitFailure, "cannot connect to PostgreSQL", "does not exist")
}
