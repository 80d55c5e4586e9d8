package idemsqlite

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

func TestMigrator(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := OpenDB(ctx, filepath.Join(t.TempDir(), "m.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	m, err := NewMigrator(db)
	if err != nil {
		t.Fatal(err)
	}
	wantStatus := func(applied bool) {
		t.Helper()
		st, err := m.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(st) != LatestVersion() || st[0].Version != 1 || st[0].Name != "create_records" {
			t.Fatalf("Status = %+v", st)
		}
		for _, s := range st {
			if s.Applied != applied || s.AppliedAt.IsZero() == applied {
				t.Errorf("Status %+v, want applied=%v", s, applied)
			}
		}
	}
	wantStatus(false)
	if v, err := m.Version(ctx); err != nil || v != 0 {
		t.Errorf("Version before Up = %d, %v", v, err)
	}

	res, err := m.Up(ctx)
	if err != nil || len(res.Versions) != LatestVersion() || res.Versions[0] != 1 {
		t.Fatalf("Up = %+v, %v", res, err)
	}
	wantStatus(true)
	if res, err := m.Up(ctx); err != nil || len(res.Versions) != 0 {
		t.Errorf("second Up = %+v, %v; want nothing to do", res, err)
	}
	if v, err := m.Version(ctx); err != nil || v != LatestVersion() {
		t.Errorf("Version after Up = %d, %v", v, err)
	}
	store, err := New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Ping(ctx); err != nil {
		t.Errorf("Ping after Up: %v", err)
	}

	if _, err := m.Down(ctx, 0); err == nil {
		t.Error("Down(0): want an error")
	}
	res, err = m.Down(ctx, 1)
	if err != nil || len(res.Versions) != 1 || res.Versions[0] != LatestVersion() {
		t.Fatalf("Down(1) = %+v, %v", res, err)
	}
	if LatestVersion() == 1 {
		wantStatus(false)
		var n int
		if err := db.QueryRow("SELECT count(*) FROM sqlite_schema WHERE name LIKE 'idem_records%' OR name = 'idem_token_counter'").Scan(&n); err != nil || n != 0 {
			t.Errorf("Down left %d objects behind (%v)", n, err)
		}
	}
	if res, err := m.Down(ctx, 100); err != nil || len(res.Versions) != LatestVersion()-1 {
		t.Errorf("Down past the start = %+v, %v", res, err)
	}
	if err := store.Ping(ctx); !errors.Is(err, ErrNotMigrated) {
		t.Errorf("Ping after Down: got %v, want ErrNotMigrated", err)
	}
	// Up again after a full Down: the down SQL really reverted everything.
	if res, err := m.Up(ctx); err != nil || len(res.Versions) != LatestVersion() {
		t.Errorf("Up after Down = %+v, %v", res, err)
	}
}

func TestMigratorConcurrentUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "m.db")
	errs := make(chan error, 8)
	applied := make(chan int, 8*LatestVersion())
	for range 8 {
		go func() {
			db, err := OpenDB(ctx, path)
			if err != nil {
				errs <- err
				return
			}
			defer db.Close()
			m, _ := NewMigrator(db)
			res, err := m.Up(ctx)
			for _, v := range res.Versions {
				applied <- v
			}
			errs <- err
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Errorf("concurrent Up: %v", err)
		}
	}
	if n := len(applied); n != LatestVersion() {
		t.Errorf("8 concurrent migrators applied %d migrations, want %d", n, LatestVersion())
	}
}

func TestMigrationSQL(t *testing.T) {
	t.Parallel()
	up, err := SQL(DirectionUp, 1)
	if err != nil || !strings.Contains(up, "CREATE TABLE idem_records") {
		t.Errorf("SQL(up, 1) = %q, %v", up, err)
	}
	m := &Migrator{}
	down, err := m.SQL(DirectionDown, 1)
	if err != nil || !strings.Contains(down, "DROP TABLE IF EXISTS idem_records") {
		t.Errorf("SQL(down, 1) = %q, %v", down, err)
	}
	for _, v := range []int{0, LatestVersion() + 1} {
		if _, err := SQL(DirectionUp, v); err == nil {
			t.Errorf("SQL(up, %d): want an error", v)
		}
	}
	if _, err := SQL("sideways", 1); err == nil {
		t.Error("SQL(sideways): want an error")
	}
	if got := Migrations(); len(got) != LatestVersion() || got[0].Up != up {
		t.Errorf("Migrations() = %+v", got)
	}
}
