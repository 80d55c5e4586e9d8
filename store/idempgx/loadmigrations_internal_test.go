package idempgx

import (
	"testing"
	"testing/fstest"
)

func TestLoadMigrationsRejectsBadFiles(t *testing.T) {
	t.Parallel()
	f := func(files ...string) fstest.MapFS {
		m := fstest.MapFS{}
		for _, name := range files {
			m["migration/"+name] = &fstest.MapFile{Data: []byte("SELECT 1;")}
		}
		return m
	}
	for name, fsys := range map[string]fstest.MapFS{
		"no direction":  f("001_a.sql"),
		"no number":     f("a.up.sql", "a.down.sql"),
		"zero":          f("000_a.up.sql", "000_a.down.sql"),
		"missing down":  f("001_a.up.sql"),
		"gap":           f("001_a.up.sql", "001_a.down.sql", "003_c.up.sql", "003_c.down.sql"),
		"two names":     f("001_a.up.sql", "001_b.down.sql"),
		"no migrations": {},
	} {
		if _, err := loadMigrations(fsys); err == nil {
			t.Errorf("%s: loadMigrations succeeded", name)
		}
	}
	ms, err := loadMigrations(f("002_b.down.sql", "001_a.up.sql", "002_b.up.sql", "001_a.down.sql", "README"))
	if err != nil || len(ms) != 2 || ms[0].Name != "a" || ms[1].Version != 2 {
		t.Fatalf("loadMigrations = %+v, %v", ms, err)
	}
}
