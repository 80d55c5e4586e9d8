// Package migration reads the embedded, numbered SQL migrations that the SQL
// stores ship (NNN_name.up.sql / NNN_name.down.sql), so that each store keeps
// only the code that applies them to its own database.
package migration

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"
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

// MustLoad is [Load] for a store's embedded migrations, read once at init:
// a packaging mistake panics with the store's name (owner, e.g.
// "idempgx") rather than failing half-way through a migration.
func MustLoad(fsys fs.FS, dir, owner string) []Migration {
	ms, err := Load(fsys, dir)
	if err != nil {
		panic(fmt.Sprintf("%s: %v", owner, err))
	}
	return ms
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

// Status is one migration and whether it is applied: what every SQL
// store's Migrator.Status lists and `idem migrate status` prints.
type Status struct {
	Version int
	Name    string
	Applied bool
	// AppliedAt is when it was applied, by the database's clock (zero when
	// pending).
	AppliedAt time.Time
}

// Result lists the versions a call to Up or Down applied or reverted, in
// the order it did so.
type Result struct {
	Versions []int
}

// Migrator is what every SQL store's migrator offers; the CLI drives them
// through it.
type Migrator interface {
	// Up applies every pending migration.
	Up(ctx context.Context) (Result, error)
	// Down reverts up to steps migrations, newest first.
	Down(ctx context.Context, steps int) (Result, error)
	// Status lists every migration the build knows.
	Status(ctx context.Context) ([]Status, error)
	// Version is the newest applied version (0 for none).
	Version(ctx context.Context) (int, error)
}

// Pending returns the status of ms with none applied, for a store to mark
// the applied ones with [MarkApplied].
func Pending(ms []Migration) []Status {
	out := make([]Status, len(ms))
	for i, m := range ms {
		out[i] = Status{Version: m.Version, Name: m.Name}
	}
	return out
}

// MarkApplied records that version was applied at at. Versions this build
// does not know (a newer build migrated the database) are ignored.
func MarkApplied(st []Status, version int, at time.Time) {
	if version >= 1 && version <= len(st) {
		st[version-1].Applied = true
		st[version-1].AppliedAt = at
	}
}
