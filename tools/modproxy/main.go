// Command modproxy writes a file-based Go module proxy (a GOPROXY=file://
// directory) made from the checkout: every module the workspace publishes,
// at the version it will be published under, exactly as the go command would
// download it from a real proxy after the tags are pushed.
//
//	go run ./modproxy -work ../go.work -out /tmp/proxy [-version v0.2.0]
//
// The published modules are the ones go.work's replace block maps from a
// version to a directory ("github.com/idem-go/idem/store/idempgx v0.1.0 =>
// ./store/idempgx"); modules used only in the workspace (bench, sdktest,
// tools) have no such line and are left out. Each gets @v/list, .info, .mod
// and .zip; the zip is made by golang.org/x/mod/zip, which applies the
// module zip rules (nested modules, vendor and VCS directories left out, size
// limits, case-insensitive name clashes refused), so a checkout that could
// not be published fails here.
//
// .ci/installcheck uses it to install cmd/idem and build a user module with
// GOWORK=off against the module graph as it will be published.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/idem-go/idem/tools/internal/work"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	modzip "golang.org/x/mod/zip"
)

func main() { work.Main("modproxy", run) }

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("modproxy", flag.ContinueOnError)
	workFile := fs.String("work", "go.work", "the workspace file whose replace block names the published modules")
	out := fs.String("out", "", "the proxy directory to write (created if missing)")
	version := fs.String("version", "", "publish every module at this version (default: the version in go.work's replace block)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" {
		return errors.New("-out is required")
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	_, mods, err := work.Load(*workFile)
	if err != nil {
		return err
	}
	t := time.Now().UTC().Truncate(time.Second)
	for _, m := range mods {
		if *version != "" {
			m.Version = *version
		}
		if err := write(*out, m, t); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s %s\n", m.Path, m.Version)
	}
	return nil
}

// mod is one published module.
type mod = work.Module

func mv(m mod) module.Version { return module.Version{Path: m.Path, Version: m.Version} }

// write adds m to the proxy directory out.
func write(out string, m mod, t time.Time) error {
	if err := work.CheckVersion(m.Version); err != nil {
		return fmt.Errorf("%s: %w", m.Path, err)
	}
	if err := module.Check(m.Path, m.Version); err != nil {
		return err
	}
	esc, err := module.EscapePath(m.Path)
	if err != nil {
		return err
	}
	ver, err := module.EscapeVersion(m.Version)
	if err != nil {
		return err
	}
	dir := filepath.Join(out, filepath.FromSlash(esc), "@v")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	gomod, err := os.ReadFile(filepath.Join(m.Dir, "go.mod"))
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, ver+".mod"), gomod, 0o644); err != nil {
		return err
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{m.Version, t})
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, ver+".info"), info, 0o644); err != nil {
		return err
	}
	if err := writeZip(filepath.Join(dir, ver+".zip"), m); err != nil {
		return err
	}
	return addToList(filepath.Join(dir, "list"), m.Version)
}

// writeZip writes the module zip of m to name, removing it again if the
// checkout breaks a module zip rule.
func writeZip(name string, m mod) error {
	f, err := os.Create(name)
	if err != nil {
		return err
	}
	err = modzip.CreateFromDir(f, mv(m), m.Dir)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(name)
		return fmt.Errorf("%s %s: %w", m.Path, m.Version, err)
	}
	return nil
}

// addToList adds version to the @v/list file name, keeping it sorted.
func addToList(name, version string) error {
	data, err := os.ReadFile(name)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	versions := strings.Fields(string(data))
	if !slices.Contains(versions, version) {
		versions = append(versions, version)
	}
	semver.Sort(versions)
	return os.WriteFile(name, []byte(strings.Join(versions, "\n")+"\n"), 0o644)
}
