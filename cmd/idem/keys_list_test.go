package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/idem-go/idem/store/idemsqlite"
	"github.com/jackc/pgx/v5/pgxpool"
)

// testKeysListing drives keys list, find and delete by selectors against
// s, which the CLI sees through storeArgs and which holds no records yet.
func testKeysListing(t *testing.T, storeArgs []string, s idem.Store) {
	cli := func(args ...string) cliResult { return runCLI(t, nil, append(args, storeArgs...)...) }
	httpScope := idemhttp.Scope("alice", "POST", "POST /pay")
	seeds := [][2]string{{"orders", "k1"}, {"orders", "k2"}, {"orders/eu", "k1"}, {"payments", "p-1"}, {httpScope, "k1"}}
	for _, sk := range seeds {
		seedRecord(t, s, sk[0], sk[1], []byte("r"), time.Hour)
	}
	// One in progress.
	if _, err := s.Claim(t.Context(), idem.ClaimRequest{Scope: "payments", Key: "p-2", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}

	r := cli("keys", "list")
	wantExit(t, r, exitOK)
	if n := strings.Count(r.Stdout, "\n"); n != 7 || !strings.HasPrefix(r.Stdout, "SCOPE ") || strings.Contains(r.Stdout, "--cursor") {
		t.Errorf("keys list: want a header and 6 records, got:\n%s", r.Stdout)
	}
	for _, w := range [][]string{{`"orders/eu"`, `"k1"`, "completed"}, {`"payments"`, `"p-2"`, "in_progress"},
		{`"http \"alice\" POST POST /pay"`, idem.ScopeHash(httpScope)}} {
		if !hasLineWith(r.Stdout, w...) {
			t.Errorf("keys list lacks a line with %q:\n%s", w, r.Stdout)
		}
	}

	count := func(args ...string) int {
		t.Helper()
		r := cli(append([]string{"keys", "list", "--json"}, args...)...)
		wantExit(t, r, exitOK)
		var j listJSON
		if err := json.Unmarshal([]byte(r.Stdout), &j); err != nil {
			t.Fatalf("keys list --json %s: %v\n%s", strings.Join(args, " "), err, r.Stdout)
		}
		return len(j.Records)
	}
	for _, tc := range []struct {
		args []string
		want int
	}{
		{nil, 6},
		{[]string{"--key", "k1"}, 3},
		{[]string{"--key-prefix", "p-"}, 2},
		{[]string{"--scope", "orders"}, 2},
		{[]string{"--scope-prefix", "orders"}, 3},
		{[]string{"--scope-prefix", "http "}, 1},
		{[]string{"--scope-hash", idem.ScopeHash(httpScope)}, 1},
		{[]string{"--scope-hash", strings.ToUpper(idem.ScopeHash(httpScope))}, 1},
		{[]string{"--state", "in_progress"}, 1},
		{[]string{"--state", "in-progress"}, 1},
		{[]string{"--state", "completed", "--scope", "payments"}, 1},
		{[]string{"--newer-than", "1h"}, 6},
		{[]string{"--older-than", "1h"}, 0},
	} {
		if got := count(tc.args...); got != tc.want {
			t.Errorf("keys list %s: want %d records, got %d", strings.Join(tc.args, " "), tc.want, got)
		}
	}

	// Pages: --limit, then the cursor the last line gives.
	seen := map[string]bool{}
	args := []string{"keys", "list", "--json", "--limit", "2"}
	for pages := 0; ; pages++ {
		if pages > 10 {
			t.Fatal("keys list --limit 2 does not end")
		}
		r := cli(args...)
		wantExit(t, r, exitOK)
		var j listJSON
		if err := json.Unmarshal([]byte(r.Stdout), &j); err != nil || len(j.Records) > 2 {
			t.Fatalf("keys list %v: %v\n%s", args, err, r.Stdout)
		}
		for _, rec := range j.Records {
			seen[rec.Scope+"/"+rec.Key] = true
		}
		if j.Next == "" {
			break
		}
		args = []string{"keys", "list", "--json", "--limit", "2", "--cursor", j.Next}
	}
	if len(seen) != 6 {
		t.Errorf("paging with --limit 2 listed %d distinct records, want 6: %v", len(seen), seen)
	}
	r = cli("keys", "list", "--limit", "1")
	if wantExit(t, r, exitOK); !strings.Contains(r.Stdout, "more records may match: add --cursor ") {
		t.Errorf("keys list --limit 1 does not give the cursor:\n%s", r.Stdout)
	}
	wantExit(t, cli("keys", "list", "--cursor", "nonsense"), exitUsage, `--cursor "nonsense": not a cursor`)
	r = cli("keys", "list", "--key", "nope")
	if wantExit(t, r, exitOK); r.Stdout != "no records match\n" {
		t.Errorf("keys list matching nothing printed %q", r.Stdout)
	}

	// find: every scope of a key; none is exit 1.
	r = cli("keys", "find", "k1")
	wantExit(t, r, exitOK)
	for _, w := range []string{`"orders"`, `"orders/eu"`, idem.ScopeHash(httpScope), "read one with: idem keys get k1 --scope SCOPE"} {
		if !strings.Contains(r.Stdout, w) {
			t.Errorf("keys find lacks %q:\n%s", w, r.Stdout)
		}
	}
	wantExit(t, cli("keys", "find", "nope"), exitFailure, `key "nope" not found in any scope`)
	wantExit(t, cli("keys", "get", "k2"), exitFailure, "idem keys find k2 searches every scope")

	// delete by selectors: --yes, --dry-run, nothing matched.
	wantExit(t, cli("keys", "delete", "--scope-prefix", "orders"), exitUsage, "would delete 3 record(s) from", "add --yes")
	r = cli("keys", "delete", "--scope-prefix", "orders", "--dry-run")
	if wantExit(t, r, exitOK); !strings.Contains(r.Stdout, "would delete 3 record(s)") || !strings.Contains(r.Stdout, `"orders/eu"`) {
		t.Errorf("keys delete --dry-run:\n%s", r.Stdout)
	}
	if got := count(); got != 6 {
		t.Fatalf("a delete without --yes or with --dry-run deleted records: %d left of 6", got)
	}
	r = cli("keys", "delete", "--scope-prefix", "orders", "--key", "k1", "--yes")
	if wantExit(t, r, exitOK); !strings.Contains(r.Stdout, "deleted 2 record(s) from") {
		t.Errorf("keys delete --yes printed %q", r.Stdout)
	}
	wantExit(t, cli("keys", "delete", "--scope", "orders", "--yes"), exitOK, "deleted 1 record(s)")
	wantExit(t, cli("keys", "delete", "--scope", "orders", "--yes"), exitFailure, "no records of", "match; nothing deleted")
	if got := count(); got != 3 {
		t.Errorf("after deleting 3 of 6 records, %d are listed", got)
	}
	wantExit(t, cli("keys", "delete", "p-1", "--scope", "payments", "--dry-run"), exitOK, `would delete key "p-1" in scope "payments"`)
	wantExit(t, cli("keys", "delete", "p-1", "--scope", "payments"), exitOK, `deleted key "p-1"`)
}

// openMigratedSQLite migrates a new SQLite database with the CLI and
// returns its DSN and a store over it, closed when the test ends.
func openMigratedSQLite(t *testing.T) (string, *idemsqlite.Store) {
	t.Helper()
	dsn := migratedSQLite(t)
	s, err := idemsqlite.Open(t.Context(), dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return dsn, s
}

// migratedPostgres migrates a new schema with the CLI and returns the
// store flags that name it (its schema is last) and a store over it.
func migratedPostgres(t *testing.T) ([]string, *idempgx.Store) {
	t.Helper()
	url := postgresURL(t)
	schema := testSchema(t, url)
	args := []string{"--store", url, "--schema", schema}
	wantExit(t, runCLI(t, nil, append([]string{"migrate", "up"}, args...)...), exitOK)
	pool, err := pgxpool.New(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := idempgx.New(pool, &idempgx.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	return args, s
}

func TestKeysListingSQLite(t *testing.T) {
	t.Parallel()
	dsn, s := openMigratedSQLite(t)
	testKeysListing(t, []string{"--store", dsn}, s)
}

func TestKeysListingPostgres(t *testing.T) {
	t.Parallel()
	args, s := migratedPostgres(t)
	testKeysListing(t, args, s)
}

func TestKeysListingRedis(t *testing.T) {
	t.Parallel()
	dsn := redisTestDSN(t)
	s, closeStore, err := openStore(t.Context(), storeConfig{DSN: dsn})
	if err != nil {
		t.Fatal(err)
	}
	defer closeStore()
	testKeysListing(t, []string{"--store", dsn}, s)
}

func TestKeysListingMySQL(t *testing.T) {
	t.Parallel()
	dsn := mysqlDatabase(t)
	wantExit(t, runCLI(t, nil, "migrate", "up", "--store", dsn), exitOK)
	testKeysListing(t, []string{"--store", dsn}, openTestStore(t, storeConfig{DSN: dsn}))
}

func TestKeysSelectorUsage(t *testing.T) {
	t.Parallel()
	dsn := "sqlite://" + filepath.Join(t.TempDir(), "idem.db")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"keys", "delete"}, "give KEY, or selectors"},
		{[]string{"keys", "delete", "k", "--key-prefix", "x"}, "the selectors and --json are for deleting without KEY"},
		{[]string{"keys", "delete", "--key-prefix", "x", "--json"}, "--json goes with --dry-run"},
		{[]string{"keys", "list", "--scope-hash", "a4c81e4d"}, "--scope-hash must be 16 hex digits"},
		{[]string{"keys", "list", "--state", "done"}, `--state must be "in_progress" or "completed"`},
		{[]string{"keys", "list", "--older-than", "-1h"}, "must not be negative"},
		{[]string{"keys", "list", "--limit", "-1"}, "--limit must not be negative"},
		{[]string{"keys", "list", "--key", "caf\u00e9"}, "--key: invalid idempotency key"},
		{[]string{"keys", "find", ""}, "invalid idempotency key"},
		{[]string{"keys", "find", "k", "--limit", "-2"}, "--limit must not be negative"},
	} {
		wantExit(t, runCLI(t, nil, append(tc.args, "--store", dsn)...), exitUsage, tc.want)
	}
	// IDEM_SCOPE narrows a selection but does not select a whole scope.
	wantExit(t, runCLI(t, map[string]string{"IDEM_SCOPE": "orders"}, "keys", "delete", "--yes", "--store", dsn), exitUsage, "give KEY, or selectors")
}

// hasLineWith reports whether a line of out holds every one of words.
func hasLineWith(out string, words ...string) bool {
	for _, line := range strings.Split(out, "\n") {
		all := true
		for _, w := range words {
			all = all && strings.Contains(line, w)
		}
		if all {
			return true
		}
	}
	return false
}
