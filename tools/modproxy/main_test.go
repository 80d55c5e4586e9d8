package main

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idem-go/idem/tools/internal/worktest"
	"golang.org/x/mod/module"
	modzip "golang.org/x/mod/zip"
)

const goWork = `go 1.26.0

use (
	.
	./store/x
	./bench
)

replace (
	example.com/Root v0.1.0 => ./
	example.com/Root/store/x v0.1.0 => ./store/x
	golang.org/x/text v0.3.0 => golang.org/x/text v0.4.0
)
`

func sample(t *testing.T) string {
	return worktest.Checkout(t, map[string]string{
		"go.work":            goWork,
		"go.mod":             "module example.com/Root\n\ngo 1.26\n",
		"root.go":            "package root\n",
		"docs/a.md":          "doc\n",
		"store/x/go.mod":     "module example.com/Root/store/x\n\ngo 1.26\n\nrequire example.com/Root v0.1.0\n",
		"store/x/x.go":       "package x\n",
		"bench/go.mod":       "module example.com/Root/bench\n\ngo 1.26\n",
		"bench/bench.go":     "package bench\n",
		".git/HEAD":          "ref: refs/heads/main\n",
		"vendor/modules.txt": "",
	})
}

func TestWritesProxy(t *testing.T) {
	root := sample(t)
	out := t.TempDir()
	var stdout strings.Builder
	if err := run([]string{"-work", filepath.Join(root, "go.work"), "-out", out}, &stdout); err != nil {
		t.Fatal(err)
	}
	if want := "example.com/Root v0.1.0\nexample.com/Root/store/x v0.1.0\n"; stdout.String() != want {
		t.Errorf("stdout = %q, want %q", stdout.String(), want)
	}
	// The module path is case-escaped; bench has no replace line, so it is
	// not published.
	for name, want := range map[string]string{
		"example.com/!root/@v/list":               "v0.1.0\n",
		"example.com/!root/@v/v0.1.0.mod":         "module example.com/Root\n\ngo 1.26\n",
		"example.com/!root/store/x/@v/list":       "v0.1.0\n",
		"example.com/!root/store/x/@v/v0.1.0.mod": "module example.com/Root/store/x\n\ngo 1.26\n\nrequire example.com/Root v0.1.0\n",
	} {
		got, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	if _, err := os.Stat(filepath.Join(out, "example.com/!root/bench")); !os.IsNotExist(err) {
		t.Errorf("bench was published: %v", err)
	}
	var info struct{ Version string }
	data, err := os.ReadFile(filepath.Join(out, "example.com/!root/@v/v0.1.0.info"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &info); err != nil || info.Version != "v0.1.0" {
		t.Errorf("info = %s (%v)", data, err)
	}
	// The root's zip leaves out the nested modules and the VCS directory.
	m := module.Version{Path: "example.com/Root", Version: "v0.1.0"}
	cf, err := modzip.CheckZip(m, filepath.Join(out, "example.com/!root/@v/v0.1.0.zip"))
	if err != nil {
		t.Fatal(err)
	}
	got := strings.ReplaceAll(strings.Join(cf.Valid, " "), "example.com/Root@v0.1.0/", "")
	if want := "docs/a.md go.mod go.work root.go"; got != want {
		t.Errorf("root zip holds %q, want %q", got, want)
	}
}

func TestVersionFlagAddsToList(t *testing.T) {
	root := sample(t)
	out := t.TempDir()
	for _, v := range []string{"v0.2.0", "v0.10.0", "v0.2.0"} {
		if err := run([]string{"-work", filepath.Join(root, "go.work"), "-out", out, "-version", v}, io.Discard); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(filepath.Join(out, "example.com/!root/store/x/@v/list"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "v0.2.0\nv0.10.0\n"; string(got) != want {
		t.Errorf("list = %q, want %q", got, want)
	}
}

func TestErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		args  []string // after -work
		want  string
	}{
		{
			name: "no out",
			want: "-out is required",
		},
		{
			name: "extra arguments",
			args: []string{"-out", "o", "x"},
			want: "unexpected arguments",
		},
		{
			name:  "no go.work",
			files: map[string]string{"go.mod": "module example.com/a\n"},
			args:  []string{"-out", "o"},
			want:  "no such file",
		},
		{
			name:  "bad go.work",
			files: map[string]string{"go.work": "go 1.26\nbogus\n"},
			args:  []string{"-out", "o"},
			want:  "unknown directive",
		},
		{
			name:  "no replace",
			files: map[string]string{"go.work": "go 1.26\n\nuse .\n", "go.mod": "module example.com/a\n"},
			args:  []string{"-out", "o"},
			want:  "no replace directive",
		},
		{
			name:  "missing module directory",
			files: map[string]string{"go.work": "go 1.26\n\nreplace example.com/a v0.1.0 => ./a\n"},
			args:  []string{"-out", "o"},
			want:  "example.com/a v0.1.0: open",
		},
		{
			name:  "wrong module path",
			files: map[string]string{"go.work": "go 1.26\n\nreplace example.com/a v0.1.0 => ./a\n", "a/go.mod": "module example.com/b\n"},
			args:  []string{"-out", "o"},
			want:  `its go.mod says module "example.com/b"`,
		},
		{
			name:  "bad version",
			files: map[string]string{"go.work": "go 1.26\n\nreplace example.com/a v0.1.0 => ./a\n", "a/go.mod": "module example.com/a\n"},
			args:  []string{"-out", "o", "-version", "v1"},
			want:  `"v1" is not a canonical semantic version`,
		},
		{
			name:  "major version suffix",
			files: map[string]string{"go.work": "go 1.26\n\nreplace example.com/a v0.1.0 => ./a\n", "a/go.mod": "module example.com/a\n"},
			args:  []string{"-out", "o", "-version", "v2.0.0"},
			want:  "invalid version",
		},
		{
			name: "zip rule broken",
			files: map[string]string{
				"go.work": "go 1.26\n\nreplace example.com/a v0.1.0 => ./a\n", "a/go.mod": "module example.com/a\n",
				"a/x.go": "package a\n", "a/X.go": "package a\n",
			},
			args: []string{"-out", "o"},
			want: "example.com/a v0.1.0: ",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := worktest.Checkout(t, tc.files)
			args := []string{"-work", filepath.Join(root, "go.work")}
			for _, a := range tc.args {
				if a == "o" {
					a = filepath.Join(root, "out")
				}
				args = append(args, a)
			}
			err := run(args, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
			if tc.name == "zip rule broken" {
				if _, err := os.Stat(filepath.Join(root, "out/example.com/a/@v/v0.1.0.zip")); !os.IsNotExist(err) {
					t.Errorf("a broken zip was left behind: %v", err)
				}
			}
		})
	}
}
