package migration

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"time"
)

func TestLoad(t *testing.T) {
	t.Parallel()
	fsys := func(names ...string) fstest.MapFS {
		m := fstest.MapFS{}
		for _, n := range names {
			m["m/"+n] = &fstest.MapFile{Data: []byte("-- " + n)}
		}
		return m
	}
	ms, err := Load(fsys("002_b.down.sql", "001_a.up.sql", "002_b.up.sql", "001_a.down.sql", "README.md"), "m")
	if err != nil || len(ms) != 2 || ms[0].Name != "a" || ms[1].Version != 2 || ms[1].Up != "-- 002_b.up.sql" || ms[0].Down != "-- 001_a.down.sql" {
		t.Fatalf("Load = %+v, %v", ms, err)
	}
	bad := map[string]fstest.MapFS{
		"missing down":   fsys("001_a.up.sql"),
		"gap":            fsys("001_a.up.sql", "001_a.down.sql", "003_c.up.sql", "003_c.down.sql"),
		"bad direction":  fsys("001_a.sideways.sql"),
		"no number":      fsys("a_b.up.sql", "a_b.down.sql"),
		"zero":           fsys("000_a.up.sql", "000_a.down.sql"),
		"two names":      fsys("001_a.up.sql", "001_b.down.sql"),
		"empty":          fsys(),
		"no such folder": {},
	}
	for name, f := range bad {
		if _, err := Load(f, "m"); err == nil {
			t.Errorf("%s: Load succeeded", name)
		}
	}
}

func TestSQL(t *testing.T) {
	t.Parallel()
	ms := []Migration{{Version: 1, Name: "a", Up: "up 1", Down: "down 1"}, {Version: 2, Name: "b", Up: "up 2", Down: "down 2"}}
	if q, err := SQL(ms, Up, 2); err != nil || q != "up 2" {
		t.Errorf("SQL(up, 2) = %q, %v", q, err)
	}
	if q, err := SQL(ms, Down, 1); err != nil || q != "down 1" {
		t.Errorf("SQL(down, 1) = %q, %v", q, err)
	}
	for _, c := range []struct {
		d Direction
		v int
	}{{Up, 0}, {Up, 3}, {"sideways", 1}} {
		if _, err := SQL(ms, c.d, c.v); err == nil {
			t.Errorf("SQL(%q, %d) succeeded", c.d, c.v)
		}
	}
}

func TestPendingAndMarkApplied(t *testing.T) {
	t.Parallel()
	st := Pending([]Migration{{Version: 1, Name: "a"}, {Version: 2, Name: "b"}})
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	MarkApplied(st, 1, at)
	MarkApplied(st, 7, at) // from a newer build: ignored
	MarkApplied(st, 0, at)
	want := []Status{{Version: 1, Name: "a", Applied: true, AppliedAt: at}, {Version: 2, Name: "b"}}
	if !slices.Equal(st, want) {
		t.Fatalf("status = %+v, want %+v", st, want)
	}
}

func TestMustLoad(t *testing.T) {
	t.Parallel()
	ok := fstest.MapFS{"m/001_a.up.sql": {Data: []byte("x")}, "m/001_a.down.sql": {Data: []byte("y")}}
	if ms := MustLoad(ok, "m", "store"); len(ms) != 1 || ms[0].Up != "x" {
		t.Fatalf("MustLoad = %+v", ms)
	}
	defer func() {
		if r := recover(); r == nil || !strings.HasPrefix(fmt.Sprint(r), "store: ") {
			t.Fatalf("MustLoad of a bad set: panic %v, want one naming the store", r)
		}
	}()
	MustLoad(fstest.MapFS{"m/001_a.up.sql": {}}, "m", "store")
}
