package idemmysql_test

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/idem-go/idem/store/idemmysql"
)

func TestMigrateUpDownStatus(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	db := newDB(t, 4)
	m, err := idemmysql.NewMigrator(db)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := m.Version(ctx); err != nil || v != 0 {
		t.Fatalf("Version of an empty database = %d, %v", v, err)
	}
	st, err := m.Status(ctx)
	if err != nil || len(st) != idemmysql.LatestVersion() || st[0].Applied {
		t.Fatalf("Status before = %+v, %v", st, err)
	}
	res, err := m.Up(ctx)
	if err != nil || len(res.Versions) != idemmysql.LatestVersion() {
		t.Fatalf("Up = %+v, %v", res, err)
	}
	if res, err := m.Up(ctx); err != nil || len(res.Versions) != 0 {
		t.Fatalf("second Up = %+v, %v; want nothing to do", res, err)
	}
	st, err = m.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st {
		if !s.Applied || s.AppliedAt.IsZero() {
			t.Errorf("after Up: %+v", s)
		}
	}
	s, _ := idemmysql.New(db, nil)
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping after Up: %v", err)
	}
	res, err = m.Down(ctx, 1)
	if err != nil || len(res.Versions) != 1 || res.Versions[0] != idemmysql.LatestVersion() {
		t.Fatalf("Down(1) = %+v, %v", res, err)
	}
	if err := s.Ping(ctx); !errors.Is(err, idemmysql.ErrNotMigrated) {
		t.Fatalf("Ping after Down(1) = %v; want ErrNotMigrated", err)
	}
	if _, err := m.Down(ctx, 0); err == nil {
		t.Fatal("Down(0) succeeded")
	}
	res, err = m.Down(ctx, 99)
	if err != nil || len(res.Versions) != idemmysql.LatestVersion()-1 {
		t.Fatalf("Down(99) = %+v, %v", res, err)
	}
	var tables int
	if err := db.QueryRow("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name <> 'idem_migrations'").Scan(&tables); err != nil || tables != 0 {
		t.Fatalf("tables left after Down = %d, %v", tables, err)
	}
	// Up again after a full Down: the files are re-runnable.
	if res, err := m.Up(ctx); err != nil || len(res.Versions) != idemmysql.LatestVersion() {
		t.Fatalf("Up after Down = %+v, %v", res, err)
	}
}

// Replicas starting at once: every migration is applied exactly once.
func TestMigrateConcurrent(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	db := newDB(t, 8)
	var (
		mu      sync.Mutex
		applied []int
		wg      sync.WaitGroup
	)
	for range 6 {
		wg.Go(func() {
			m, _ := idemmysql.NewMigrator(db)
			res, err := m.Up(ctx)
			if err != nil {
				t.Errorf("Up: %v", err)
			}
			mu.Lock()
			applied = append(applied, res.Versions...)
			mu.Unlock()
		})
	}
	wg.Wait()
	if len(applied) != idemmysql.LatestVersion() {
		t.Fatalf("applied %v; want each of 1..%d once", applied, idemmysql.LatestVersion())
	}
}

// A database migrated by a newer build is refused, not downgraded.
func TestMigrateNewerDatabase(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	db := migratedDB(t, 2)
	if _, err := db.Exec("INSERT INTO idem_migrations (version, name, applied_at) VALUES (?, 'future', UTC_TIMESTAMP(6))", idemmysql.LatestVersion()+1); err != nil {
		t.Fatal(err)
	}
	m, _ := idemmysql.NewMigrator(db)
	if _, err := m.Up(ctx); err == nil || !strings.Contains(err.Error(), "upgrade idem") {
		t.Fatalf("Up on a newer database = %v", err)
	}
	s, _ := idemmysql.New(db, nil)
	if err := s.Ping(ctx); err == nil || !strings.Contains(err.Error(), "upgrade idem") {
		t.Fatalf("Ping on a newer database = %v", err)
	}
}

func TestMigrationSQL(t *testing.T) {
	t.Parallel()
	up, err := idemmysql.SQL(idemmysql.DirectionUp, 1)
	if err != nil || !strings.Contains(up, "CREATE TABLE IF NOT EXISTS idem_records") {
		t.Fatalf("SQL(up, 1) = %q, %v", up, err)
	}
	down, err := idemmysql.SQL(idemmysql.DirectionDown, 2)
	if err != nil || !strings.Contains(down, "DROP TABLE IF EXISTS idem_inbox") {
		t.Fatalf("SQL(down, 2) = %q, %v", down, err)
	}
	if _, err := idemmysql.SQL(idemmysql.DirectionUp, 0); err == nil {
		t.Fatal("SQL(up, 0) succeeded")
	}
	if len(idemmysql.Migrations()) != idemmysql.LatestVersion() {
		t.Fatal("Migrations and LatestVersion disagree")
	}
	if _, err := idemmysql.NewMigrator(nil); err == nil {
		t.Fatal("NewMigrator(nil) succeeded")
	}
}
