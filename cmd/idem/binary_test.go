package main

import (
	"bufio"
	"bytes"
	"database/sql"
	"errors"
	"io"
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

// TestBinaryVerifyInterrupted: Ctrl-C during "idem verify" is reported as an
// interruption (exit 130), not as a store that breaks idem's contract, and
// the records the run wrote are deleted.
func TestBinaryVerifyInterrupted(t *testing.T) {
	t.Parallel()
	bin := buildIdem(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "v.db")
	dsn := "sqlite://" + path
	wantExit(t, runIdem(t, bin, dir, "migrate", "up", "--store", dsn), exitOK)

	cmd := exec.Command(bin, "verify", "--store", dsn, "--keys", "10000", "--copies", "20")
	cmd.Dir = dir
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The first line is printed once the store is open, well after the
	// signal handler is installed: interrupt the storm from there.
	out := bufio.NewReader(stdout)
	first, err := out.ReadString('\n')
	if err != nil || !strings.HasPrefix(first, "verifying SQLite store "+dsn) {
		t.Fatalf("first line %q, %v", first, err)
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(out)
	err = cmd.Wait()
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.ExitCode() != exitInterrupted {
		t.Fatalf("verify after SIGINT: %v\nstdout: %s%s\nstderr: %s", err, first, rest, errOut.String())
	}
	if !strings.Contains(string(rest), "interrupted during duplicate storm") || strings.Contains(string(rest), "FAIL") ||
		!strings.Contains(errOut.String(), "verify interrupted; its records under scope") {
		t.Fatalf("stdout: %s%s\nstderr: %s", first, rest, errOut.String())
	}

	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM idem_records WHERE scope LIKE 'idem-verify/%'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("records left by the interrupted verify: %d, %v", n, err)
	}
}
