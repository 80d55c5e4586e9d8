package idempgx_test

import (
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/idem-go/idem/store/idempgx"
	"github.com/jackc/pgx/v5"
)

func TestMigrateUpDownStatus(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	ctx := ctxT(t)
	p := testPool(t)
	m, err := idempgx.NewMigrator(p, &idempgx.MigratorConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	latest := idempgx.LatestVersion()
	if latest < 1 || len(idempgx.Migrations()) != latest {
		t.Fatalf("latest %d, %d migrations", latest, len(idempgx.Migrations()))
	}

	st, err := m.Status(ctx)
	if err != nil || len(st) != latest || st[0].Applied || st[0].Name != "create_records" {
		t.Fatalf("status before up = %+v, %v", st, err)
	}
	if v, err := m.Version(ctx); err != nil || v != 0 {
		t.Fatalf("version before up = %d, %v", v, err)
	}

	res, err := m.Up(ctx)
	if err != nil || len(res.Versions) != latest || res.Versions[0] != 1 {
		t.Fatalf("up = %+v, %v", res, err)
	}
	if res, err := m.Up(ctx); err != nil || len(res.Versions) != 0 {
		t.Fatalf("second up = %+v, %v; want nothing to do", res, err)
	}
	st, err = m.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st {
		if !s.Applied || s.AppliedAt.IsZero() {
			t.Fatalf("status after up = %+v", st)
		}
	}
	s, err := idempgx.New(p, &idempgx.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("check after up: %v", err)
	}

	if _, err := m.Down(ctx, 0); err == nil {
		t.Fatal("down 0 succeeded")
	}
	res, err = m.Down(ctx, latest+5)
	if err != nil || len(res.Versions) != latest || res.Versions[len(res.Versions)-1] != 1 {
		t.Fatalf("down all = %+v, %v", res, err)
	}
	var tables int
	if err := p.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename <> 'idem_migrations'", schema).Scan(&tables); err != nil || tables != 0 {
		t.Fatalf("tables left after down: %d, %v", tables, err)
	}
	err = s.Ping(ctx)
	var nm *idempgx.NotMigratedError
	if !errors.Is(err, idempgx.ErrNotMigrated) || !errors.As(err, &nm) || nm.Version != 0 || nm.Want != latest {
		t.Fatalf("check after down = %v; want NotMigratedError at 0", err)
	}
	// Up again after a full down works.
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestMigrateCreatesSchema(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	p := testPool(t)
	schema := "idemtest_new_" + randomSuffix()
	t.Cleanup(func() { _, _ = p.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE") })
	m, _ := idempgx.NewMigrator(p, &idempgx.MigratorConfig{Schema: schema})
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	s, _ := idempgx.New(p, &idempgx.Config{Schema: schema})
	if err := s.Ping(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestMigrateConcurrentUp(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	ctx := ctxT(t)
	p := testPool(t)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		applied []int
	)
	for range 8 {
		wg.Go(func() {
			m, _ := idempgx.NewMigrator(p, &idempgx.MigratorConfig{Schema: schema})
			res, err := m.Up(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			applied = append(applied, res.Versions...)
			mu.Unlock()
		})
	}
	wg.Wait()
	if len(applied) != idempgx.LatestVersion() {
		t.Fatalf("8 concurrent migrators applied %v; want each migration exactly once", applied)
	}
	s, _ := idempgx.New(p, &idempgx.Config{Schema: schema})
	if err := s.Ping(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestMigrateNewerDatabase(t *testing.T) {
	t.Parallel()
	schema := migratedSchema(t)
	ctx := ctxT(t)
	p := testPool(t)
	if _, err := p.Exec(ctx, "INSERT INTO "+pgx.Identifier{schema, "idem_migrations"}.Sanitize()+" (version, name) VALUES (999, 'future')"); err != nil {
		t.Fatal(err)
	}
	m, _ := idempgx.NewMigrator(p, &idempgx.MigratorConfig{Schema: schema})
	if _, err := m.Up(ctx); err == nil || !strings.Contains(err.Error(), "newer than this build") {
		t.Fatalf("up on a newer schema: %v", err)
	}
}

func TestMigrationSQL(t *testing.T) {
	t.Parallel()
	up, err := idempgx.SQL(idempgx.DirectionUp, 1)
	if err != nil || !strings.Contains(up, "CREATE TABLE idem_records") || !strings.Contains(up, "idem_token_seq") {
		t.Fatalf("up SQL = %q, %v", up, err)
	}
	down, err := idempgx.SQL(idempgx.DirectionDown, 1)
	if err != nil || !strings.Contains(down, "DROP TABLE idem_records") {
		t.Fatalf("down SQL = %q, %v", down, err)
	}
	for _, tc := range []struct {
		dir     idempgx.Direction
		version int
	}{{idempgx.DirectionUp, 0}, {idempgx.DirectionUp, idempgx.LatestVersion() + 1}, {"sideways", 1}} {
		if _, err := idempgx.SQL(tc.dir, tc.version); err == nil {
			t.Errorf("SQL(%q, %d) succeeded", tc.dir, tc.version)
		}
	}
	if _, err := idempgx.NewMigrator(nil, nil); err == nil {
		t.Error("NewMigrator(nil) succeeded")
	}
}

func TestPingNotMigrated(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	ctx := ctxT(t)
	s, _ := idempgx.New(testPool(t), &idempgx.Config{Schema: schema})
	err := s.Ping(ctx)
	if !errors.Is(err, idempgx.ErrNotMigrated) {
		t.Fatalf("check of empty schema = %v; want ErrNotMigrated", err)
	}
	want := "idem: postgres schema " + schema + " is not migrated (at version 0, want " + strconv.Itoa(idempgx.LatestVersion()) + "); run `idem migrate up --store postgres://…`"
	if err.Error() != want {
		t.Fatalf("message = %q\nwant      %q", err.Error(), want)
	}
}
