// Command setversion moves the repository to a new release version: it
// writes VERSION into go.work's replace block (which maps each published
// module's version to the checkout) and into every requirement of one
// published module by another, in the go.mod of every module of the
// workspace. Other requirements and the files' layout and comments are left
// as they are.
//
//	go run ./setversion -work ../go.work [-n] v0.2.0
//
// -n prints the changes without writing them. docs/RELEASING.md says when to
// run it.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/idem-go/idem/tools/internal/work"
	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
)

func main() { work.Main("setversion", run) }

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("setversion", flag.ContinueOnError)
	workFile := fs.String("work", "go.work", "the workspace file")
	dryRun := fs.Bool("n", false, "print the changes, write nothing")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("want exactly one argument, the version (v0.2.0)")
	}
	version := fs.Arg(0)
	if err := work.CheckVersion(version); err != nil {
		return err
	}
	wf, mods, err := work.Load(*workFile)
	if err != nil {
		return err
	}
	published := map[string]bool{}
	for _, m := range mods {
		// Our module paths have no /vN suffix: v2 and later would need one.
		if err := module.Check(m.Path, version); err != nil {
			return err
		}
		published[m.Path] = true
	}

	// Compute every change before writing any, so a file that does not
	// parse leaves the checkout untouched.
	type edit struct {
		name string
		data []byte
	}
	var edits []edit
	data, changes, err := setWork(wf, published, version)
	if err != nil {
		return err
	}
	for _, c := range changes {
		fmt.Fprintf(stdout, "%s: %s\n", rel(wf, wf.Name), c)
	}
	if !bytes.Equal(data, wf.Data) {
		edits = append(edits, edit{wf.Name, data})
	}
	for _, u := range wf.Use {
		name := filepath.Join(wf.Dir(u.Path), "go.mod")
		old, err := os.ReadFile(name)
		if err != nil {
			return err
		}
		data, changes, err := setRequires(name, old, published, version)
		if err != nil {
			return err
		}
		for _, c := range changes {
			fmt.Fprintf(stdout, "%s: %s\n", rel(wf, name), c)
		}
		if !bytes.Equal(data, old) {
			edits = append(edits, edit{name, data})
		}
	}
	if *dryRun {
		return nil
	}
	for _, e := range edits {
		if err := os.WriteFile(e.name, e.data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// setWork returns go.work with every published module's replace line at
// version, and the changes made.
func setWork(wf *work.File, published map[string]bool, version string) ([]byte, []string, error) {
	var changes []string
	for _, r := range wf.Replace {
		if !published[r.Old.Path] || r.Old.Version == version {
			continue
		}
		// The line's tokens are [replace] path version => dir.
		tok := r.Syntax.Token
		i := 0
		for i < len(tok) && tok[i] != r.Old.Version {
			i++
		}
		if i == len(tok) {
			return nil, nil, fmt.Errorf("%s:%d: no version token in the replace line of %s", wf.Name, r.Syntax.Start.Line, r.Old.Path)
		}
		tok[i] = version
		changes = append(changes, fmt.Sprintf("replace %s %s -> %s", r.Old.Path, r.Old.Version, version))
		r.Old.Version = version
	}
	return modfile.Format(wf.Syntax), changes, nil
}

// setRequires returns the go.mod data (of file name) with every requirement
// of a published module at version, and the changes made.
func setRequires(name string, data []byte, published map[string]bool, version string) ([]byte, []string, error) {
	f, err := modfile.Parse(name, data, nil)
	if err != nil {
		return nil, nil, err
	}
	var changes []string
	for _, r := range f.Require {
		if !published[r.Mod.Path] || r.Mod.Version == version {
			continue
		}
		changes = append(changes, fmt.Sprintf("require %s %s -> %s", r.Mod.Path, r.Mod.Version, version))
	}
	for _, r := range f.Require {
		if published[r.Mod.Path] {
			if err := f.AddRequire(r.Mod.Path, version); err != nil {
				return nil, nil, err
			}
		}
	}
	f.Cleanup()
	out, err := f.Format()
	return out, changes, err
}

// rel names a file relative to the workspace's directory.
func rel(wf *work.File, name string) string {
	if r, err := filepath.Rel(filepath.Dir(wf.Name), name); err == nil {
		return r
	}
	return name
}
