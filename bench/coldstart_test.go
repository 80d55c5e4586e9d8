package bench_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/bench"
)

// tinyModule writes a module of one package with no imports, so that a
// build with an empty cache compiles only it (well under a second), and
// returns its directory.
func tinyModule(t *testing.T, src string) string {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{
		"go.mod":  "module example.com/tiny\n\ngo 1.26\n",
		"tiny.go": src,
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestMeasureColdStartTiny builds a tiny package with an empty cache and
// checks the wall and CPU times were read from the build (the child's
// rusage) and the temporary cache is gone afterwards.
func TestMeasureColdStartTiny(t *testing.T) {
	t.Setenv("GOWORK", "off")
	before := tempEntries(t)
	dir := tinyModule(t, "package tiny\n\nfunc F() int { return 42 }\n")
	c, err := bench.MeasureColdStart(context.Background(), dir, ".")
	if err != nil {
		t.Fatal(err)
	}
	if c.Err != nil {
		t.Fatalf("build failed: %v", c.Err)
	}
	if c.Wall <= 0 || c.User+c.Sys <= 0 || c.CPU() != c.User+c.Sys {
		t.Errorf("wall %v, user %v, sys %v: want all read", c.Wall, c.User, c.Sys)
	}
	if c.Package != "." || c.Dir != dir {
		t.Errorf("package %q dir %q", c.Package, c.Dir)
	}
	if _, err := os.Stat("/proc/loadavg"); err == nil && len(strings.Fields(c.Load)) != 3 {
		t.Errorf("load %q: want the three load averages", c.Load)
	}
	for e := range tempEntries(t) {
		if strings.HasPrefix(e, "idembench-coldstart-") && !before[e] {
			t.Errorf("temporary build cache %s left behind", e)
		}
	}
}

func tempEntries(t *testing.T) map[string]bool {
	t.Helper()
	es, err := os.ReadDir(os.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	m := make(map[string]bool, len(es))
	for _, e := range es {
		m[e.Name()] = true
	}
	return m
}

// TestMeasureColdStartBuildFails reports a package that does not compile in
// Err, with the compiler's message, and not as a run error.
func TestMeasureColdStartBuildFails(t *testing.T) {
	t.Setenv("GOWORK", "off")
	dir := tinyModule(t, "package tiny\n\nfunc F() int { return \"x\" }\n")
	c, err := bench.MeasureColdStart(context.Background(), dir, ".")
	if err != nil {
		t.Fatal(err)
	}
	if c.Err == nil || !strings.Contains(c.Err.Error(), "cannot use") {
		t.Errorf("Err = %v, want the compile error", c.Err)
	}
	if c.Met() {
		t.Error("a failed build meets the target")
	}
}

func coldStartSection(t *testing.T, c *bench.ColdStart) string {
	t.Helper()
	var buf bytes.Buffer
	rep := &bench.Report{Date: time.Date(2026, 12, 3, 13, 0, 0, 0, time.UTC), Runs: 5, ColdStart: c}
	if err := rep.WriteMarkdown(&buf, nil); err != nil {
		t.Fatal(err)
	}
	text := buf.String()
	i := strings.Index(text, "## Cold start\n")
	if i < 0 {
		if c != nil {
			t.Fatalf("no cold start section in\n%s", text)
		}
		return ""
	}
	j := strings.Index(text[i+1:], "\n## ")
	return text[i : i+1+j]
}

func TestColdStartSection(t *testing.T) {
	if s := coldStartSection(t, nil); s != "" {
		t.Errorf("section without a measurement:\n%s", s)
	}
	slow := &bench.ColdStart{Package: "./cmd/idem/demo", Wall: 83600 * time.Millisecond,
		User: 128 * time.Second, Sys: 26 * time.Second, Load: "0.05 0.10 0.20"}
	s := coldStartSection(t, slow)
	for _, want := range []string{"`go run ./cmd/idem/demo`", "empty, temporary build cache",
		"| `go build ./cmd/idem/demo`, empty GOCACHE | 83.6 s (1m23.6s) | 128 s + 26 s = 154 s | 0.05 0.10 0.20 | < 60 s | **not met** |"} {
		if !strings.Contains(s, want) {
			t.Errorf("section lacks %q:\n%s", want, s)
		}
	}
	fast := &bench.ColdStart{Package: "./cmd/idem/demo", Wall: 41 * time.Second, User: 70 * time.Second, Sys: 9 * time.Second}
	if s := coldStartSection(t, fast); !strings.Contains(s, "| 41.0 s | 70 s + 9 s = 79 s | n/a | < 60 s | met |") {
		t.Errorf("fast build's row:\n%s", s)
	}
	failed := &bench.ColdStart{Package: "./cmd/idem/demo", Wall: time.Second, Err: errors.New("go build: exit status 1: a | b\nmore")}
	s = coldStartSection(t, failed)
	if !strings.Contains(s, "Not measured: go build: exit status 1: a / b …") || strings.Contains(s, "| met |") {
		t.Errorf("failed build's section:\n%s", s)
	}
}
