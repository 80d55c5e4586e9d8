package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// buildIdem compiles the idem binary into a temporary directory, once per
// test that needs it, so these tests run the real process: exit codes,
// stdout and stderr as a user sees them.
func buildIdem(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the binary; skipped with -short")
	}
	bin := filepath.Join(t.TempDir(), "idem")
	if runtime.GOOS == "windows" {
		bin += ".exe"
	}
	cmd := exec.Command("go", "build", "-o", bin, ".")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// runIdem runs the binary with args in dir, with IDEM_* variables removed
// from the environment so the developer's settings cannot change the result.
func runIdem(t *testing.T, bin, dir string, args ...string) cliResult {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "IDEM_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		code = exitErr.ExitCode()
	} else if err != nil {
		t.Fatalf("run %s: %v", bin, err)
	}
	return cliResult{Code: code, Stdout: out.String(), Stderr: errOut.String()}
}

func TestBinary(t *testing.T) {
	t.Parallel()
	bin := buildIdem(t)
	dir := t.TempDir()

	r := runIdem(t, bin, dir, "demo")
	wantExit(t, r, exitOK)
	for _, row := range demoRows {
		if !strings.Contains(r.Stdout, "\n  "+row+" ") {
			t.Errorf("demo table lacks row %q:\n%s", row, r.Stdout)
		}
	}
	if !strings.Contains(r.Stdout, "\nOK: ") || r.Stderr != "" {
		t.Errorf("demo: stdout\n%s\nstderr\n%s", r.Stdout, r.Stderr)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("demo left files in the working directory: %v", entries)
	}

	dsn := "sqlite://" + filepath.Join(dir, "idem.db")
	wantExit(t, runIdem(t, bin, dir, "keys", "get", "--store", dsn, "nosuchkey"), exitFailure, "no SQLite database")
	wantExit(t, runIdem(t, bin, dir, "migrate", "up", "--store", dsn), exitOK)
	wantExit(t, runIdem(t, bin, dir, "keys", "get", "--store", dsn, "nosuchkey"), exitFailure, `key "nosuchkey" not found`)
	// The default store is sqlite://idem.db in the working directory.
	wantExit(t, runIdem(t, bin, dir, "keys", "get", "nosuchkey"), exitFailure, `key "nosuchkey" not found`, "sqlite://idem.db")

	wantExit(t, runIdem(t, bin, dir, "keys", "get", "--store", "postgres://u@127.0.0.1:1/x", "k"), exitFailure, "cannot connect to PostgreSQL")
	wantExit(t, runIdem(t, bin, dir, "nonsense"), exitUsage, `unknown command "nonsense"`)

	r = runIdem(t, bin, dir, "version")
	wantExit(t, r, exitOK)
	if !strings.HasPrefix(r.Stdout, "idem ") {
		t.Errorf("version printed %q", r.Stdout)
	}
}
