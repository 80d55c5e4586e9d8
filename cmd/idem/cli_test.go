package main

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idemsqlite"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// cliResult is what one in-process run of the command line produced.
type cliResult struct {
	Code           int
	Stdout, Stderr string
}

// runCLI runs idem with args in-process. env is the whole environment the
// command sees: nothing leaks in from the test process.
func runCLI(t *testing.T, env map[string]string, args ...string) cliResult {
	t.Helper()
	var out, errOut bytes.Buffer
	code := runEnv(t.Context(), args, &out, &errOut, func(k string) string { return env[k] })
	return cliResult{Code: code, Stdout: out.String(), Stderr: errOut.String()}
}

// wantExit fails unless r exited with code and, for failures, printed the
// one-line "idem: …" error containing every wanted fragment, with no usage
// dump or stack trace.
func wantExit(t *testing.T, r cliResult, code int, wants ...string) {
	t.Helper()
	if r.Code != code {
		t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", r.Code, code, r.Stdout, r.Stderr)
	}
	if code == exitOK {
		return
	}
	lines := strings.Split(strings.TrimRight(r.Stderr, "\n"), "\n")
	wantLines := 1
	if code == exitUsage {
		wantLines = 2 // the error and "Run '… --help' for usage."
	}
	if len(lines) != wantLines || !strings.HasPrefix(lines[0], "idem: ") || strings.HasPrefix(lines[0], "idem: idem") {
		t.Fatalf("stderr is not %d line(s) starting with a single \"idem: \":\n%s", wantLines, r.Stderr)
	}
	if code == exitUsage && !strings.HasPrefix(lines[1], "Run 'idem") {
		t.Fatalf("usage error without the help hint:\n%s", r.Stderr)
	}
	for _, bad := range []string{"goroutine ", "panic", "Usage:", "Flags:"} {
		if strings.Contains(r.Stderr, bad) {
			t.Fatalf("stderr contains %q:\n%s", bad, r.Stderr)
		}
	}
	for _, w := range wants {
		if !strings.Contains(lines[0], w) {
			t.Fatalf("error line lacks %q:\n%s", w, lines[0])
		}
	}
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		args  []string
		wants []string
	}{
		{"unknown command", []string{"bogus"}, []string{`unknown command "bogus"`}},
		{"group without subcommand", []string{"keys"}, []string{"missing subcommand", "delete, find, get, list, maintain, purge"}},
		{"unknown subcommand", []string{"migrate", "sideways"}, []string{`unknown command "sideways"`, "down, sql, status, up"}},
		{"missing key", []string{"keys", "get"}, []string{"accepts 1 arg"}},
		{"unknown flag", []string{"keys", "get", "--nope", "k"}, []string{"unknown flag: --nope"}},
		{"bad flag value", []string{"demo", "--seed", "minus-one"}, []string{`invalid value "minus-one" for --seed: want a whole number`}},
		{"empty key", []string{"keys", "get", ""}, []string{"invalid idempotency key", "empty"}},
		{"key not ASCII", []string{"keys", "delete", "caf\u00e9"}, []string{"invalid idempotency key", "not printable ASCII"}},
		{"zero steps", []string{"migrate", "down", "--steps", "0"}, []string{"--steps must be positive"}},
		{"negative batch", []string{"keys", "purge", "--batch", "-1"}, []string{"--batch must not be negative"}},
		{"sql version out of range", []string{"migrate", "sql", "99"}, []string{"VERSION must be a number from 1 to"}},
		{"demo on postgres", []string{"demo", "--store", "postgres://u:secret@h/db"}, []string{"demo runs on the embedded SQLite store"}},
		{"demo messages", []string{"demo", "--messages", "0"}, []string{"--messages must be between"}},
		{"demo workers", []string{"demo", "--workers", "-1"}, []string{"--workers must be between"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := runCLI(t, nil, tt.args...)
			wantExit(t, r, exitUsage, tt.wants...)
			if strings.Contains(r.Stderr, "secret") {
				t.Fatalf("password echoed: %s", r.Stderr)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	t.Parallel()
	r := runCLI(t, nil)
	wantExit(t, r, exitOK)
	for _, w := range []string{"demo", "migrate", "keys", "version"} {
		if !strings.Contains(r.Stdout, w) {
			t.Errorf("help lacks %q:\n%s", w, r.Stdout)
		}
	}
	r = runCLI(t, nil, "keys", "get", "--help")
	wantExit(t, r, exitOK)
	for _, w := range []string{"--store", "(env IDEM_STORE)", "--scope", "(env IDEM_SCOPE)", "--json", "--schema"} {
		if !strings.Contains(r.Stdout, w) {
			t.Errorf("keys get --help lacks %q:\n%s", w, r.Stdout)
		}
	}
	// --store's help names every scheme the CLI knows.
	for _, b := range backends {
		if !strings.Contains(r.Stdout, b.Example) {
			t.Errorf("keys get --help does not name %s (%s):\n%s", b.Name, b.Example, r.Stdout)
		}
	}
}

func TestVersion(t *testing.T) {
	t.Parallel()
	r := runCLI(t, nil, "version")
	wantExit(t, r, exitOK)
	if !strings.HasPrefix(r.Stdout, "idem ") || !strings.Contains(r.Stdout, "go1.") {
		t.Fatalf("version output %q", r.Stdout)
	}
	if flag := runCLI(t, nil, "--version"); flag.Code != exitOK || flag.Stdout != r.Stdout {
		t.Fatalf("idem --version: exit %d, %q; want %q", flag.Code, flag.Stdout, r.Stdout)
	}
	info := func(bi *debug.BuildInfo, ok bool) func() (*debug.BuildInfo, bool) {
		return func() (*debug.BuildInfo, bool) { return bi, ok }
	}
	tests := []struct {
		name string
		read func() (*debug.BuildInfo, bool)
		want string
	}{
		{"no build info", info(nil, false), "devel"},
		{"tagged module", info(&debug.BuildInfo{Main: debug.Module{Version: "v1.2.3"}}, true), "v1.2.3"},
		{"devel without vcs", info(&debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, true), "devel"},
		{"devel with vcs", info(&debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.modified", Value: "true"},
		}}, true), "devel+0123456789ab-dirty"},
	}
	for _, tt := range tests {
		if got := version(tt.read); got != tt.want {
			t.Errorf("%s: version() = %q, want %q", tt.name, got, tt.want)
		}
	}
}

// TestEnvFallback checks the precedence flag > IDEM_* > default, through the
// path each choice names in the error for a missing SQLite file.
func TestEnvFallback(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	fromEnv := "sqlite://" + filepath.Join(dir, "from-env.db")
	fromFlag := "sqlite://" + filepath.Join(dir, "from-flag.db")
	env := map[string]string{"IDEM_STORE": fromEnv}

	wantExit(t, runCLI(t, nil, "keys", "get", "k"), exitFailure, "no SQLite database at idem.db")
	wantExit(t, runCLI(t, env, "keys", "get", "k"), exitFailure, "from-env.db")
	wantExit(t, runCLI(t, env, "keys", "get", "--store", fromFlag, "k"), exitFailure, "from-flag.db")
	wantExit(t, runCLI(t, map[string]string{"IDEM_DEMO_SEED": "x"}, "demo"), exitUsage, `invalid value "x" in IDEM_DEMO_SEED for --seed`)
	// Flags with no fallback of their own get IDEM_<command path>_<flag>.
	wantExit(t, runCLI(t, map[string]string{"IDEM_MIGRATE_DOWN_STEPS": "0"}, "migrate", "down"), exitUsage, "--steps must be positive, got 0")
	wantExit(t, runCLI(t, map[string]string{"IDEM_BACKOFF_CLIENTS": "many"}, "backoff"), exitUsage, `in IDEM_BACKOFF_CLIENTS for --clients`)
}

// TestEveryFlagHasAnEnvFallback walks the command tree: every flag but
// help, version and the --yes confirmations names an IDEM_* variable in its
// help, and no two flags of one command share one.
func TestEveryFlagHasAnEnvFallback(t *testing.T) {
	t.Parallel()
	a := &app{stdout: io.Discard, stderr: io.Discard, getenv: func(string) string { return "" }}
	root := a.rootCmd()
	var walk func(c *cobra.Command)
	n := 0
	walk = func(c *cobra.Command) {
		seen := map[string]string{}
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			env := f.Annotations[envAnnotation]
			if noEnv[f.Name] {
				if len(env) != 0 {
					t.Errorf("%s --%s must not have an environment fallback, has %v", c.CommandPath(), f.Name, env)
				}
				return
			}
			n++
			if len(env) != 1 || !strings.HasPrefix(env[0], "IDEM_") || !strings.Contains(f.Usage, "(env "+env[0]+")") {
				t.Errorf("%s --%s: environment fallback %v, usage %q", c.CommandPath(), f.Name, env, f.Usage)
				return
			}
			if other, dup := seen[env[0]]; dup {
				t.Errorf("%s: --%s and --%s share %s", c.CommandPath(), other, f.Name, env[0])
			}
			seen[env[0]] = f.Name
		})
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
	if n < 40 {
		t.Fatalf("walked only %d flags", n)
	}
	if got := autoEnv(root.Commands()[0], "dry-run"); !strings.HasPrefix(got, "IDEM_") || strings.Contains(got, "-") {
		t.Errorf("autoEnv = %q", got)
	}
}

func TestBadStoreDSN(t *testing.T) {
	t.Parallel()
	tests := []struct {
		dsn   string
		wants []string
	}{
		{"idem.db", []string{"invalid --store", "want SCHEME://"}},
		{"oracle://localhost/db", []string{`unknown scheme "oracle"`, "mysql://", "postgres://", "sqlite://"}},
		{"mysql://user name:hunter2@host/db", []string{"invalid --store", "mysql://xxxxx@host/db"}},
		{"sqlite://", []string{"invalid --store", "no file path"}},
		{"sqlite://:memory:", []string{"invalid --store", "in-memory"}},
		{"postgres://user name:hunter2@host/db", []string{"invalid --store", "postgres://xxxxx@host/db"}},
		{"postgres://u@127.0.0.1:99999/db", []string{"invalid --store"}},
	}
	for _, tt := range tests {
		for _, args := range [][]string{{"keys", "get", "k"}, {"migrate", "status"}} {
			t.Run(tt.dsn+"/"+args[0], func(t *testing.T) {
				t.Parallel()
				r := runCLI(t, nil, append(args, "--store", tt.dsn)...)
				wantExit(t, r, exitFailure, tt.wants...)
				if strings.Contains(r.Stderr, "hunter2") {
					t.Fatalf("password echoed: %s", r.Stderr)
				}
			})
		}
	}
}

func TestUnreachablePostgres(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"keys", "get", "k"}, {"migrate", "up"}, {"keys", "purge"}} {
		t.Run(args[0]+" "+args[1], func(t *testing.T) {
			t.Parallel()
			r := runCLI(t, nil, append(args, "--store", "postgres://idem:pw@127.0.0.1:1/x")...)
			wantExit(t, r, exitFailure, "cannot connect to PostgreSQL at 127.0.0.1:1/x", "connection refused", "check that the server is running")
			if strings.Contains(r.Stderr, "pw@") {
				t.Fatalf("password echoed: %s", r.Stderr)
			}
		})
	}
}

func TestMigrateSQLNeedsNoConnection(t *testing.T) {
	t.Parallel()
	for _, dsn := range []string{"sqlite://nowhere/x.db", "postgres://u@127.0.0.1:1/x"} {
		r := runCLI(t, nil, "migrate", "sql", "--store", dsn)
		wantExit(t, r, exitOK)
		if !strings.Contains(r.Stdout, "migration 1 (create_records) up") || !strings.Contains(r.Stdout, "CREATE TABLE idem_records") {
			t.Fatalf("%s: migrate sql printed:\n%s", dsn, r.Stdout)
		}
		r = runCLI(t, nil, "migrate", "sql", "--down", "1", "--store", dsn)
		wantExit(t, r, exitOK)
		if !strings.Contains(r.Stdout, "down") || !strings.Contains(r.Stdout, "DROP TABLE") {
			t.Fatalf("%s: migrate sql --down printed:\n%s", dsn, r.Stdout)
		}
	}
}

// seedRecord completes (scope, key) with result through the store API, as
// an application would, and returns the fingerprint it used.
func seedRecord(t *testing.T, s idem.Store, scope, key string, result []byte, retention time.Duration) idem.Fingerprint {
	t.Helper()
	ctx := t.Context()
	fp := idem.FingerprintBytes([]byte(scope + "/" + key))
	c, err := s.Claim(ctx, idem.ClaimRequest{Scope: scope, Key: key, Fingerprint: fp, Lease: time.Minute})
	if err != nil || c.Outcome != idem.Acquired {
		t.Fatalf("claim %q: %v %v", key, c.Outcome, err)
	}
	if err := s.Complete(ctx, idem.CompleteRequest{Scope: scope, Key: key, Token: c.Token, Result: result, Retention: retention}); err != nil {
		t.Fatalf("complete %q: %v", key, err)
	}
	return fp
}

// testKeysLifecycle drives migrate and keys against one store: open(t)
// returns the store the CLI sees, with its migrations applied, for seeding
// records. args are the store flags.
func testKeysLifecycle(t *testing.T, storeArgs []string, open func(t *testing.T) idem.Store) {
	cli := func(args ...string) cliResult { return runCLI(t, nil, append(args, storeArgs...)...) }

	r := cli("keys", "get", "k")
	if r.Code != exitFailure || !(strings.Contains(r.Stderr, "not migrated") || strings.Contains(r.Stderr, "no SQLite database")) ||
		!strings.Contains(r.Stderr, "idem migrate up --store") {
		t.Fatalf("unmigrated store: exit %d, stderr %q", r.Code, r.Stderr)
	}
	wantExit(t, r, exitFailure)

	r = cli("migrate", "up")
	wantExit(t, r, exitOK)
	if !strings.Contains(r.Stdout, "applied migrations 1") {
		t.Fatalf("migrate up printed %q", r.Stdout)
	}
	r = cli("migrate", "up")
	wantExit(t, r, exitOK)
	if !strings.Contains(r.Stdout, "up to date") {
		t.Fatalf("second migrate up printed %q", r.Stdout)
	}
	r = cli("migrate", "status")
	wantExit(t, r, exitOK)
	if !strings.Contains(r.Stdout, "create_records") || !strings.Contains(r.Stdout, "applied") || strings.Contains(r.Stdout, "pending") {
		t.Fatalf("migrate status printed:\n%s", r.Stdout)
	}

	wantExit(t, cli("keys", "get", "nosuchkey"), exitFailure, `key "nosuchkey" not found`)

	s := open(t)
	key := `order 42; "quoted" %*:`
	fp := seedRecord(t, s, "payments", key, []byte("receipt-123"), time.Hour)
	seedRecord(t, s, "", "expiring", nil, time.Millisecond)

	r = cli("keys", "get", "--scope", "payments", key)
	wantExit(t, r, exitOK)
	for _, w := range []string{"state          completed", "token", fp.String(), "result         11 bytes", "tombstone      no", "expires", `"payments"`} {
		if !strings.Contains(r.Stdout, w) {
			t.Errorf("keys get lacks %q:\n%s", w, r.Stdout)
		}
	}
	// The same key in another scope is another record.
	wantExit(t, cli("keys", "get", key), exitFailure, "not found")

	r = cli("keys", "get", "--json", "--scope", "payments", key)
	wantExit(t, r, exitOK)
	var got recordJSON
	if err := json.Unmarshal([]byte(r.Stdout), &got); err != nil {
		t.Fatalf("keys get --json: %v\n%s", err, r.Stdout)
	}
	if got.Key != key || got.Scope != "payments" || got.State != idem.StateCompleted || got.Fingerprint != fp.String() ||
		string(got.Result) != "receipt-123" || got.ResultSize != 11 || got.Tombstone || got.Token <= 0 ||
		got.CompletedAt == nil || got.ExpiresAt == nil || got.LeaseExpiresAt != nil {
		t.Fatalf("keys get --json = %+v", got)
	}

	// Purge removes only the expired record.
	time.Sleep(20 * time.Millisecond)
	r = cli("keys", "purge")
	wantExit(t, r, exitOK)
	if !strings.Contains(r.Stdout, "purged 1 expired records") {
		t.Fatalf("keys purge printed %q", r.Stdout)
	}
	wantExit(t, cli("keys", "get", "expiring"), exitFailure, "not found")
	wantExit(t, cli("keys", "get", "--scope", "payments", key), exitOK)

	r = cli("keys", "delete", "--scope", "payments", key)
	wantExit(t, r, exitOK)
	if !strings.Contains(r.Stdout, "deleted key") {
		t.Fatalf("keys delete printed %q", r.Stdout)
	}
	wantExit(t, cli("keys", "get", "--scope", "payments", key), exitFailure, "not found")
	wantExit(t, cli("keys", "delete", "--scope", "payments", key), exitFailure, "not found")

	// migrate down drops data: without --yes it names what it would revert
	// and where, and reverts nothing.
	r = cli("migrate", "down")
	wantExit(t, r, exitUsage, "would revert", "(create_", "add --yes")                        // the latest migration
	wantExit(t, cli("keys", "get", "--scope", "payments", key+"x"), exitFailure, "not found") // still migrated
	r = cli("migrate", "status", "--json")
	wantExit(t, r, exitOK)
	var st migrateStatusJSON
	if err := json.Unmarshal([]byte(r.Stdout), &st); err != nil || st.Pending != 0 || len(st.Migrations) < 2 ||
		!st.Migrations[0].Applied || st.Migrations[0].Name != "create_records" || st.Migrations[0].AppliedAt == nil || st.Store == "" {
		t.Fatalf("migrate status --json = %+v, %v\n%s", st, err, r.Stdout)
	}

	// Revert every migration, however many later features have added.
	r = cli("migrate", "down", "--steps", "1000", "--yes")
	wantExit(t, r, exitOK)
	if !strings.Contains(r.Stdout, "reverted migrations ") || !strings.Contains(r.Stdout, "1 in ") {
		t.Fatalf("migrate down printed %q", r.Stdout)
	}
	wantExit(t, cli("keys", "get", "k"), exitFailure, "not migrated", "at version 0 of ", "run: idem migrate up --store")
	r = cli("migrate", "status")
	wantExit(t, r, exitPending, "migrations pending")
	if !strings.Contains(r.Stdout, "pending") || !strings.Contains(r.Stdout, " pending; run: idem migrate up") {
		t.Fatalf("migrate status after down printed:\n%s", r.Stdout)
	}
	r = cli("migrate", "status", "--json")
	wantExit(t, r, exitPending)
	if err := json.Unmarshal([]byte(r.Stdout), &st); err != nil || st.Pending != len(st.Migrations) || st.Migrations[0].Applied {
		t.Fatalf("migrate status --json after down = %+v, %v", st, err)
	}
	r = cli("migrate", "down")
	wantExit(t, r, exitOK)
	if !strings.Contains(r.Stdout, "no applied migrations") {
		t.Fatalf("second migrate down printed %q", r.Stdout)
	}
}

func TestKeysSQLite(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "idem.db")
	dsn := "sqlite://" + path
	testKeysLifecycle(t, []string{"--store", dsn}, func(t *testing.T) idem.Store {
		s, err := idemsqlite.Open(t.Context(), dsn, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("migrate up did not create the database: %v", err)
	}
}

// TestSQLiteMissingFileIsNotCreated: only migrate up may create a database,
// so a mistyped path is reported, not silently made into an empty store.
func TestSQLiteMissingFileIsNotCreated(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "typo.db")
	for _, args := range [][]string{{"keys", "get", "k"}, {"keys", "delete", "k"}, {"keys", "purge"}, {"migrate", "status"}, {"migrate", "down"}} {
		r := runCLI(t, nil, append(args, "--store", "sqlite://"+path)...)
		wantExit(t, r, exitFailure, "no SQLite database at "+path, "idem migrate up --store sqlite://"+path)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("a read-only command created %s (%v)", path, err)
	}
}

func TestOneLine(t *testing.T) {
	t.Parallel()
	tests := map[string]string{
		"plain":                   "idem: plain",
		"idem: already prefixed":  "idem: already prefixed",
		"idempgx: idem: x":        "idem: x",
		"two\nlines  and   space": "idem: two lines and space",
	}
	for in, want := range tests {
		if got := oneLine(errString(in)); got != want {
			t.Errorf("oneLine(%q) = %q, want %q", in, got, want)
		}
	}
}

type errString string

func (e errString) Error() string { return string(e) }

func TestRedactDSN(t *testing.T) {
	t.Parallel()
	tests := map[string]string{
		"postgres://u:secret@h:5432/db":  "postgres://u:xxxxx@h:5432/db",
		"postgres://u@h/db":              "postgres://u@h/db",
		"postgres://u:a b@h/db":          "postgres://xxxxx@h/db",
		"sqlite://idem.db":               "sqlite://idem.db",
		"postgres://u:p%zz@h/db?x=1":     "postgres://xxxxx@h/db?x=1",
		"redis://:secret@127.0.0.1:6379": "redis://:xxxxx@127.0.0.1:6379",
	}
	for in, want := range tests {
		if got := redactDSN(in); got != want {
			t.Errorf("redactDSN(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestStoreRegistry checks that schemes are case-insensitive and that a
// backend without migrations is refused by migrate with a clear message.
func TestStoreRegistry(t *testing.T) {
	t.Parallel()
	if b, err := lookupBackend("PostgreSQL://u@h/db"); err != nil || b.Name != "PostgreSQL" {
		t.Fatalf("lookupBackend(PostgreSQL://) = %v, %v", b, err)
	}
	if b, err := lookupBackend("sqlite:///tmp/x.db"); err != nil || b.Name != "SQLite" {
		t.Fatalf("lookupBackend(sqlite://) = %v, %v", b, err)
	}
	if _, err := lookupMigrateTarget(storeConfig{DSN: "nosuchscheme://x"}); err == nil || !strings.Contains(err.Error(), "unknown scheme") {
		t.Fatalf("lookupMigrateTarget(nosuchscheme) = %v", err)
	}
}

func TestShellQuote(t *testing.T) {
	t.Parallel()
	tests := map[string]string{
		"sqlite://idem.db":                   "sqlite://idem.db",
		"postgres://u@h:5432/db?sslmode=off": "'postgres://u@h:5432/db?sslmode=off'",
		"a b":                                "'a b'",
		"it's":                               `'it'\''s'`,
		"":                                   "''",
	}
	for in, want := range tests {
		if got := shellQuote(in); got != want {
			t.Errorf("shellQuote(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestSQLiteUnusableFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk.db")
	if err := os.WriteFile(junk, bytes.Repeat([]byte("not a database "), 400), 0o600); err != nil {
		t.Fatal(err)
	}
	wantExit(t, runCLI(t, nil, "keys", "get", "k", "--store", "sqlite://"+junk), exitFailure,
		"cannot open SQLite database "+junk, "not a database")
	wantExit(t, runCLI(t, nil, "migrate", "status", "--store", "sqlite://"+dir), exitFailure, "cannot open SQLite database "+dir)
	missingDir := filepath.Join(dir, "no", "such", "dir", "x.db")
	wantExit(t, runCLI(t, nil, "migrate", "up", "--store", "sqlite://"+missingDir), exitFailure, "cannot open SQLite database "+missingDir)
}
