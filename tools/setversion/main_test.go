package main

import (
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idem-go/idem/tools/internal/worktest"
)

var sample = map[string]string{
	"go.work": `go 1.26.0

use (
	.
	./store/x
	./bench
)

// Published versions map to the checkout.
replace (
	example.com/root v0.1.0 => ./
	example.com/root/store/x v0.1.0 => ./store/x
)

replace golang.org/x/text v0.3.0 => golang.org/x/text v0.4.0
`,
	"go.mod": "module example.com/root\n\ngo 1.26\n",
	"store/x/go.mod": `module example.com/root/store/x

go 1.26

require example.com/root v0.1.0 // the core

require (
	golang.org/x/text v0.3.0
	example.com/other v0.1.0
)
`,
	"bench/go.mod": `module example.com/root/bench

go 1.26

require (
	example.com/root v0.1.0
	example.com/root/store/x v0.1.0 // indirect
)
`,
}

func TestSetsVersionAndBack(t *testing.T) {
	root := worktest.Checkout(t, sample)
	work := filepath.Join(root, "go.work")
	var out strings.Builder
	if err := run([]string{"-work", work, "v0.2.0"}, &out); err != nil {
		t.Fatal(err)
	}
	want := `go.work: replace example.com/root v0.1.0 -> v0.2.0
go.work: replace example.com/root/store/x v0.1.0 -> v0.2.0
store/x/go.mod: require example.com/root v0.1.0 -> v0.2.0
bench/go.mod: require example.com/root v0.1.0 -> v0.2.0
bench/go.mod: require example.com/root/store/x v0.1.0 -> v0.2.0
`
	if out.String() != want {
		t.Errorf("output:\n%s\nwant:\n%s", out.String(), want)
	}
	for name, content := range sample {
		got := worktest.Read(t, root, name)
		// Only our modules' versions change; layout, comments and other
		// requirements stay.
		exp := strings.NewReplacer("example.com/root v0.1.0", "example.com/root v0.2.0",
			"example.com/root/store/x v0.1.0", "example.com/root/store/x v0.2.0").Replace(content)
		if got != exp {
			t.Errorf("%s:\n%s\nwant:\n%s", name, got, exp)
		}
	}
	// And back, byte for byte.
	if err := run([]string{"-work", work, "v0.1.0"}, io.Discard); err != nil {
		t.Fatal(err)
	}
	for name, content := range sample {
		if got := worktest.Read(t, root, name); got != content {
			t.Errorf("%s after the round trip:\n%s\nwant:\n%s", name, got, content)
		}
	}
	// Already there: nothing to say.
	out.Reset()
	if err := run([]string{"-work", work, "v0.1.0"}, &out); err != nil || out.Len() != 0 {
		t.Errorf("second run: %q, %v", out.String(), err)
	}
}

func TestDryRunWritesNothing(t *testing.T) {
	root := worktest.Checkout(t, sample)
	var out strings.Builder
	if err := run([]string{"-work", filepath.Join(root, "go.work"), "-n", "v0.2.0"}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "go.work: replace example.com/root v0.1.0 -> v0.2.0") {
		t.Errorf("dry run printed %q", out.String())
	}
	for name, content := range sample {
		if got := worktest.Read(t, root, name); got != content {
			t.Errorf("dry run changed %s", name)
		}
	}
}

// The repository's own files take the round trip unchanged.
func TestRepositoryRoundTrip(t *testing.T) {
	src, err := filepath.Abs("../../go.work")
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{"go.work": worktest.Read(t, filepath.Dir(src), "go.work")}
	// Every module the workspace uses, as go.work's use block lists them.
	var dirs []string
	_, block, _ := strings.Cut(files["go.work"], "use (")
	block, _, _ = strings.Cut(block, ")")
	for _, line := range strings.Split(block, "\n") {
		if dir := strings.TrimSpace(line); dir != "" && !strings.HasPrefix(dir, "//") {
			dirs = append(dirs, dir)
		}
	}
	if len(dirs) < 15 {
		t.Fatalf("go.work uses %d modules: %q", len(dirs), dirs)
	}
	for _, dir := range dirs {
		name := filepath.ToSlash(filepath.Join(dir, "go.mod"))
		files[name] = worktest.Read(t, filepath.Dir(src), name)
	}
	root := worktest.Checkout(t, files)
	work := filepath.Join(root, "go.work")
	if err := run([]string{"-work", work, "v0.1.1"}, io.Discard); err != nil {
		t.Fatal(err)
	}
	for name := range files {
		if got := worktest.Read(t, root, name); strings.Contains(got, "idem-go/idem v0.1.0") || strings.Contains(got, "/shared v0.1.0") {
			t.Errorf("%s still names v0.1.0:\n%s", name, got)
		}
	}
	if got := worktest.Read(t, root, "cmd/idem/go.mod"); !strings.Contains(got, "github.com/idem-go/idem/store/idemsqlite v0.1.1") {
		t.Errorf("cmd/idem/go.mod:\n%s", got)
	}
	if err := run([]string{"-work", work, "v0.1.0"}, io.Discard); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if got := worktest.Read(t, root, name); got != content {
			t.Errorf("%s after the round trip:\n%s\nwant:\n%s", name, got, content)
		}
	}
}

func TestErrors(t *testing.T) {
	broken := map[string]string{}
	for k, v := range sample {
		broken[k] = v
	}
	broken["bench/go.mod"] = "module example.com/root/bench\n\nrequire (\n"
	for _, tc := range []struct {
		name  string
		files map[string]string
		args  []string
		want  string
	}{
		{"no version", sample, nil, "want exactly one argument"},
		{"two versions", sample, []string{"v0.2.0", "v0.3.0"}, "want exactly one argument"},
		{"not semver", sample, []string{"0.2.0"}, `"0.2.0" is not a canonical semantic version`},
		{"not canonical", sample, []string{"v0.2"}, "not a canonical semantic version"},
		{"v2 needs a path suffix", sample, []string{"v2.0.0"}, "invalid version"},
		{"bad flag", sample, []string{"-x", "v0.2.0"}, "flag provided but not defined"},
		{"no go.work", map[string]string{"go.mod": "module example.com/root\n"}, []string{"v0.2.0"}, "no such file"},
		{"nothing published", map[string]string{"go.work": "go 1.26\n\nuse .\n"}, []string{"v0.2.0"}, "no replace directive"},
		{"missing go.mod", map[string]string{"go.work": "go 1.26\n\nuse ./a\n\nreplace example.com/root v0.1.0 => ./\n", "go.mod": "module example.com/root\n"}, []string{"v0.2.0"}, "a/go.mod: no such file"},
		{"go.mod does not parse", broken, []string{"v0.2.0"}, "bench/go.mod"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := worktest.Checkout(t, tc.files)
			err := run(append([]string{"-work", filepath.Join(root, "go.work")}, tc.args...), io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
			// Nothing was written.
			for name, content := range tc.files {
				if got := worktest.Read(t, root, name); got != content {
					t.Errorf("%s changed", name)
				}
			}
		})
	}
}
