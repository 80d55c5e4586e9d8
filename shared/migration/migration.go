// Package migration reads the embedded, numbered SQL migrations that the SQL
// stores ship (NNN_name.up.sql / NNN_name.down.sql), so that each store keeps
// only the code that applies them to its own database.
package migration

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
)

// Migration is one numbered schema change.
type Migration struct {
	// Version is the migration's number; versions are applied in order.
	Version int
	// Name is the descriptive part of the file name, e.g. "create_records".
	Name string
	// Up and Down are the SQL that apply and revert the migration.
	Up, Down string
}

// Load reads dir/NNN_name.(up|down).sql from fsys and checks that every
// version has both directions and that versions run 1..n without gaps, so a
// packaging mistake fails at init rather than half-way through a migration.
// Files not ending in .sql are ignored.
func Load(fsys fs.FS, dir string) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("read migrations: %w", err)
	}
	byVersion := map[int]*Migration{}
	for _, e := range entries {
		file := e.Name()
		base, ok := strings.CutSuffix(file, ".sql")
		if !ok {
			continue
		}
		var up bool
		switch {
		case strings.HasSuffix(base, ".up"):
			up, base = true, strings.TrimSuffix(base, ".up")
		case strings.HasSuffix(base, ".down"):
			base = strings.TrimSuffix(base, ".down")
		default:
			return nil, fmt.Errorf("migration %s: name must end in .up.sql or .down.sql", file)
		}
		num, name, ok := strings.Cut(base, "_")
		version, err := strconv.Atoi(num)
		if !ok || err != nil || version <= 0 {
			return nil, fmt.Errorf("migration %s: name must start with a positive number and an underscore", file)
		}
		body, err := fs.ReadFile(fsys, path.Join(dir, file))
		if err != nil {
			return nil, fmt.Errorf("read migration %s: %w", file, err)
		}
		m := byVersion[version]
		if m == nil {
			m = &Migration{Version: version, Name: name}
			byVersion[version] = m
		}
		if m.Name != name {
			return nil, fmt.Errorf("migration %d has two names, %q and %q", version, m.Name, name)
		}
		if up {
			m.Up = string(body)
		} else {
			m.Down = string(body)
		}
	}
	out := make([]Migration, 0, len(byVersion))
	for _, m := range byVersion {
		if m.Up == "" || m.Down == "" {
			return nil, fmt.Errorf("migration %d (%s) needs both an up and a down file", m.Version, m.Name)
		}
		out = append(out, *m)
	}
	if len(out) == 0 {
		return nil, errors.New("no migrations found")
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i, m := range out {
		if m.Version != i+1 {
			return nil, fmt.Errorf("migration versions must be 1..n without gaps; missing %d", i+1)
		}
	}
	return out, nil
}

// Direction says which way a migration runs.
type Direction string

const (
	// Up applies a migration.
	Up Direction = "up"
	// Down reverts a migration.
	Down Direction = "down"
)

// SQL returns the statements of migration version in ms (which Load
// returned, so versions are 1..len(ms)) for direction.
func SQL(ms []Migration, direction Direction, version int) (string, error) {
	if version < 1 || version > len(ms) {
		return "", fmt.Errorf("no migration %d (have 1..%d)", version, len(ms))
	}
	switch direction {
	case Up:
		return ms[version-1].Up, nil
	case Down:
		return ms[version-1].Down, nil
	}
	return "", fmt.Errorf("direction must be %q or %q, got %q", Up, Down, direction)
}
