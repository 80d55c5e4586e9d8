package main

import (
	"bytes"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
)

func runDemo(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(t.Context(), args, func(k string) string { return env[k] }, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestDemoCommand(t *testing.T) {
	t.Parallel()
	dsn := "sqlite://" + filepath.Join(t.TempDir(), "ledger.db")
	code, out, errOut := runDemo(t, map[string]string{"IDEM_DEMO_SEED": "4", "IDEM_DEMO_REQUESTS": "5"},
		"--store", dsn, "--messages", "20", "--workers", "2")
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	for _, want := range []string{
		"idem demo: a payments ledger on SQLite (", "), seed 4\n",
		"\n  idem balance, 2 workers ", "\nOK: the idem consumer applied each of the 20 payments exactly once",
		"\n  parallel requests                       5   ", "\nOK: one charge; the other 4 requests got the original 201 response",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// The flag wins over the environment.
	code, out, _ = runDemo(t, map[string]string{"IDEM_DEMO_SEED": "4"}, "--store", dsn, "--seed", "5", "--messages", "5", "--workers", "0", "--requests", "0")
	if code != 0 || !strings.Contains(out, "seed 5\n") || strings.Contains(out, "parallel requests") {
		t.Errorf("--seed 5 over IDEM_DEMO_SEED=4, --requests 0: exit %d\n%s", code, out)
	}
}

func TestDemoCommandUsage(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{nil, []string{"--messages", "0"}, "idem demo: --messages must be between 1 and"},
		{nil, []string{"--store", "postgres://u:secret@h/db"}, "idem demo: demo runs on the embedded SQLite store: --store must be sqlite://PATH, got a postgres:// URL"},
		{map[string]string{"IDEM_DEMO_WORKERS": "many"}, nil, `idem demo: invalid value "many" in IDEM_DEMO_WORKERS for --workers: want a whole number`},
		{nil, []string{"extra"}, `idem demo: unexpected arguments ["extra"]`},
		{nil, []string{"--no-such-flag"}, "flag provided but not defined: -no-such-flag"},
	} {
		code, out, errOut := runDemo(t, c.env, c.args...)
		if code != 2 || out != "" || !strings.Contains(errOut, c.want) || strings.Contains(errOut, "secret") {
			t.Errorf("%v %v: exit %d, stdout %q, stderr %q; want 2 and %q", c.env, c.args, code, out, errOut, c.want)
		}
	}
	if code, _, errOut := runDemo(t, nil, "--help"); code != 0 || !strings.Contains(errOut, "Idempotency-Key") {
		t.Errorf("--help: exit %d, %q", code, errOut)
	}
}

// TestDemoCommandDeps checks what keeps the command's cold build short: none
// of the CLI's heavy dependencies is linked in.
func TestDemoCommandDeps(t *testing.T) {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		t.Skip("no build info")
	}
	for _, m := range bi.Deps {
		for _, heavy := range []string{"github.com/spf13/cobra", "github.com/jackc/pgx", "github.com/redis/rueidis", "github.com/aws/",
			"github.com/prometheus/", "github.com/chromedp/", "github.com/go-sql-driver/", "github.com/rabbitmq/"} {
			if strings.HasPrefix(m.Path, heavy) {
				t.Errorf("the demo command links %s", m.Path)
			}
		}
	}
}
