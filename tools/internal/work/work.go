// Package work reads the repository's go.work: which modules it publishes
// and which it only uses.
package work

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/semver"
)

// Module is one published module: its path, the version go.work maps to
// the checkout, and its directory.
type Module struct {
	Path, Version, Dir string
}

// File is a parsed workspace file.
type File struct {
	Name string
	Data []byte
	*modfile.WorkFile
}

// Read parses the workspace file name.
func Read(name string) (*File, error) {
	data, err := os.ReadFile(name)
	if err != nil {
		return nil, err
	}
	wf, err := modfile.ParseWork(name, data, nil)
	if err != nil {
		return nil, err
	}
	return &File{Name: name, Data: data, WorkFile: wf}, nil
}

// Dir resolves a directory named in the workspace file.
func (f *File) Dir(dir string) string {
	if filepath.IsAbs(dir) {
		return dir
	}
	return filepath.Join(filepath.Dir(f.Name), dir)
}

// Published returns the modules the replace block maps from a version to a
// directory ("github.com/idem-go/idem/store/idempgx v0.1.0 =>
// ./store/idempgx"), checking that each directory holds that module.
// Modules used only in the workspace (bench, sdktest, tools) have no such
// line.
func (f *File) Published() ([]Module, error) {
	var mods []Module
	for _, r := range f.Replace {
		if r.Old.Version == "" || r.New.Version != "" || !modfile.IsDirectoryPath(r.New.Path) {
			continue
		}
		dir := f.Dir(r.New.Path)
		gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", r.Old.Path, r.Old.Version, err)
		}
		if got := modfile.ModulePath(gomod); got != r.Old.Path {
			return nil, fmt.Errorf("%s: go.work replaces %s with it, but its go.mod says module %q", dir, r.Old.Path, got)
		}
		mods = append(mods, Module{Path: r.Old.Path, Version: r.Old.Version, Dir: dir})
	}
	if len(mods) == 0 {
		return nil, fmt.Errorf("%s: no replace directive maps a module version to a directory", f.Name)
	}
	return mods, nil
}

// CheckVersion reports whether version is a canonical semantic version
// (v1.2.3, not v1.2 or 1.2.3), the only kind a module is tagged with.
func CheckVersion(version string) error {
	if !semver.IsValid(version) || semver.Canonical(version) != version {
		return fmt.Errorf("%q is not a canonical semantic version", version)
	}
	return nil
}

// Main runs a tool's run function with the command line and exits 1,
// naming the tool, if it fails.
func Main(name string, run func(args []string, stdout io.Writer) error) {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}

// Load reads the workspace file name and returns it with the modules it
// publishes.
func Load(name string) (*File, []Module, error) {
	f, err := Read(name)
	if err != nil {
		return nil, nil, err
	}
	mods, err := f.Published()
	if err != nil {
		return nil, nil, err
	}
	return f, mods, nil
}
