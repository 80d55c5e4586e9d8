package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/idemtest"

	"github.com/redis/rueidis"
)

// redisURL returns IDEM_REDIS_URL; without it the test is skipped locally
// and fails in CI.
func redisURL(t *testing.T) string {
	t.Helper()
	return idemtest.ServiceURL(t, "IDEM_REDIS_URL")
}

// redisTestDSN returns IDEM_REDIS_URL with a key prefix of its own, whose
// keys are deleted when the test ends.
func redisTestDSN(t *testing.T) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	prefix := "idemcli:" + hex.EncodeToString(b[:]) + ":"
	sep := "?"
	if strings.Contains(redisURL(t), "?") {
		sep = "&"
	}
	dsn := redisURL(t) + sep + "prefix=" + prefix
	t.Cleanup(func() { deleteRedisPrefix(t, dsn, prefix) })
	return dsn
}

// deleteRedisPrefix removes every key under prefix (SCAN, then DEL).
func deleteRedisPrefix(t *testing.T, dsn, prefix string) {
	opt, _, err := redisOptions(dsn)
	if err != nil {
		t.Error(err)
		return
	}
	c, err := rueidis.NewClient(opt)
	if err != nil {
		t.Errorf("cleanup: %v", err)
		return
	}
	defer c.Close()
	ctx := context.Background()
	var cursor uint64
	for {
		e, err := c.Do(ctx, c.B().Scan().Cursor(cursor).Match(prefix+"*").Count(1000).Build()).AsScanEntry()
		if err != nil {
			t.Errorf("cleanup SCAN: %v", err)
			return
		}
		for _, k := range e.Elements {
			if err := c.Do(ctx, c.B().Del().Key(k).Build()).Error(); err != nil {
				t.Errorf("cleanup DEL %s: %v", k, err)
			}
		}
		if e.Cursor == 0 {
			return
		}
		cursor = e.Cursor
	}
}

func TestKeysRedis(t *testing.T) {
	t.Parallel()
	dsn := redisTestDSN(t)
	cli := func(args ...string) cliResult { return runCLI(t, nil, append(args, "--store", dsn)...) }

	s, closeStore, err := openStore(t.Context(), storeConfig{DSN: dsn})
	if err != nil {
		t.Fatal(err)
	}
	defer closeStore()
	key := `order 42; "quoted" %*:`
	fp := seedRecord(t, s, "payments", key, []byte("receipt-123"), time.Hour)
	defer s.Delete(context.Background(), "payments", key)

	r := cli("keys", "get", "--scope", "payments", key)
	wantExit(t, r, exitOK)
	for _, w := range []string{"state          completed", fp.String(), "result         11 bytes", `"payments"`} {
		if !strings.Contains(r.Stdout, w) {
			t.Errorf("keys get lacks %q:\n%s", w, r.Stdout)
		}
	}
	wantExit(t, cli("keys", "get", key), exitFailure, "not found")
	// Redis expires records itself: purge has nothing to do.
	r = cli("keys", "purge")
	wantExit(t, r, exitOK)
	if !strings.Contains(r.Stdout, "Redis deletes expired records itself (each has a TTL); nothing to purge") {
		t.Errorf("keys purge on Redis printed %q", r.Stdout)
	}
	wantExit(t, cli("keys", "purge", "--vacuum"), exitUsage, "--vacuum: Redis stores have no space to reclaim")
	wantExit(t, cli("keys", "delete", "--scope", "payments", key), exitOK)
	wantExit(t, cli("keys", "get", "--scope", "payments", key), exitFailure, "not found")
	if _, err := s.Get(t.Context(), "payments", key); err == nil {
		t.Error("keys delete left the record")
	}
	// A deploy script may migrate every store: on Redis there is nothing to
	// do, which is no failure.
	for _, args := range [][]string{{"migrate", "up"}, {"migrate", "status"}, {"migrate", "down", "--yes"}} {
		r := cli(args...)
		wantExit(t, r, exitOK)
		if !strings.Contains(r.Stdout, "Redis stores have no schema to migrate; nothing to do") {
			t.Errorf("%v printed %q", args, r.Stdout)
		}
	}
	r = cli("migrate", "status", "--json")
	wantExit(t, r, exitOK)
	if !strings.Contains(r.Stdout, `"pending": 0`) || !strings.Contains(r.Stdout, `"migrations": []`) {
		t.Errorf("migrate status --json on Redis printed %q", r.Stdout)
	}
	wantExit(t, cli("migrate", "sql"), exitFailure, "Redis stores have no schema to migrate")
	// rediss selects the same backend (TLS).
	if b, err := lookupBackend("rediss://h:6380/0"); err != nil || b.Name != "Redis" {
		t.Errorf("lookupBackend(rediss://) = %v, %v", b, err)
	}
}

func TestRedisBadDSN(t *testing.T) {
	t.Parallel()
	// An unreachable server is not tested here: rueidis keeps a retry
	// goroutine sleeping for a while after the failed dial, which the
	// package's goroutine-leak check would report.
	r := runCLI(t, nil, "keys", "get", "k", "--store", "redis://u:secret@127.0.0.1:1/0?strict=maybe")
	wantExit(t, r, exitFailure, "strict=")
	if strings.Contains(r.Stderr, "secret") {
		t.Errorf("the password leaked: %s", r.Stderr)
	}
	wantExit(t, runCLI(t, nil, "keys", "get", "k", "--store", "redis://127.0.0.1:6379/notanumber"), exitFailure, "invalid --store")
}

// idem proxy --store redis://…: a burst with one key reaches the upstream
// once and every retry replays.
func TestProxyRedis(t *testing.T) {
	t.Parallel()
	dsn := redisTestDSN(t)
	api := &orderAPI{delay: 100 * time.Millisecond}
	up := httptest.NewServer(api)
	defer up.Close()
	base, stop := inProcessProxy(t, "--upstream", up.URL, "--store", dsn, "--lease", "2s")
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 50}}
	defer client.CloseIdleConnections()
	burst(t, client, base, api, 50)
	if code, logs := stop(); code != exitOK {
		t.Fatalf("exit %d: %s", code, logs)
	}
}

// The inbox lives in the SQL stores only: on Redis every inbox command says
// so in one line instead of failing half-way.
func TestInboxOnRedisRefused(t *testing.T) {
	url := redisURL(t)
	for _, args := range [][]string{{"inbox", "stats"}, {"inbox", "dead"}, {"inbox", "redrive", "--all"}} {
		r := runCLI(t, nil, append(args, "--store", url)...)
		wantExit(t, r, exitFailure, "has no inbox", "sqlite://, postgres:// or mysql://")
	}
}

// dsnPassword is the password every malformed DSN below carries.
const dsnPassword = "s3cretPW"

// malformedDSNBodies follow "SCHEME://": each carries dsnPassword and is
// malformed for Redis in one way. Where the host and port are well formed
// they are 127.0.0.1:1, where nothing listens, so a PostgreSQL DSN that
// parses fails fast with "connection refused".
var malformedDSNBodies = []struct{ name, body string }{
	{"unclosed IPv6 bracket", "u:s3cretPW@[::1"},
	{"port not a number", "u:s3cretPW@127.0.0.1:port/0"},
	{"port above 65535", "u:s3cretPW@127.0.0.1:99999/0"},
	{"port 0", "u:s3cretPW@127.0.0.1:0/0"},
	{"negative port", "u:s3cretPW@127.0.0.1:-1/0"},
	{"two ports", "u:s3cretPW@127.0.0.1:1:2/0"},
	{"missing host", "u:s3cretPW@:1/0"},
	{"password only, bad port", ":s3cretPW@127.0.0.1:99999"},
	{"space in host", "u:s3cretPW@ho st:1/0"},
	{"space after password", "u:s3cretPW @127.0.0.1:1/0"},
	{"db not a number", "u:s3cretPW@127.0.0.1:1/notanumber"},
	{"negative db", "u:s3cretPW@127.0.0.1:1/-1"},
	{"path too deep", "u:s3cretPW@127.0.0.1:1/0/extra"},
	{"bad escape in path", "u:s3cretPW@127.0.0.1:1/%zz"},
	{"bad escape in password", "u:s3cretPW%zz@127.0.0.1:1/0"},
	{"'#' in password", "u:s3cretPW#x@127.0.0.1:1/0"},
	{"'/' in password", "u:12/s3cretPW@127.0.0.1:1/0"},
	{"'?' in password", "u:12?s3cretPW@127.0.0.1:1/0"},
	{"control character", "u:s3cretPW@127.0.0.1:1/0\n"},
	{"fragment", "u:s3cretPW@127.0.0.1:1/0#top"},
	{"db query not a number", "u:s3cretPW@127.0.0.1:1/0?db=x"},
	{"bad dial_timeout", "u:s3cretPW@127.0.0.1:1/0?dial_timeout=soon"},
	{"bad write_timeout", "u:s3cretPW@127.0.0.1:1/0?write_timeout=x"},
	{"bad strict", "u:s3cretPW@127.0.0.1:1/0?strict=maybe"},
	{"bad skip_verify", "u:s3cretPW@127.0.0.1:1/0?skip_verify=maybe"},
	{"unknown parameter", "u:s3cretPW@127.0.0.1:1/0?bogus=1"},
	{"password parameter", "u:s3cretPW@127.0.0.1:1/0?password=s3cretPW"},
	{"bad escape in query", "u:s3cretPW@127.0.0.1:1/0?%zz=1"},
	{"braces in prefix", "u:s3cretPW@127.0.0.1:1/0?prefix={x}"},
	{"bad addr seed", "u:s3cretPW@127.0.0.1:1/0?addr=[::1"},
	{"addr seed port above 65535", "u:s3cretPW@127.0.0.1:1/0?addr=127.0.0.1:99999"},
	{"bad protocol", "u:s3cretPW@127.0.0.1:1/0?protocol=9"},
}

// TestRedisDSNErrorsHidePassword: no malformed redis:// or rediss:// DSN
// gets its password echoed, and each is refused before any connection is
// attempted ("invalid --store"): a DSN rueidis would accept but cannot
// dial, such as a port above 65535, must not get as far as the network.
func TestRedisDSNErrorsHidePassword(t *testing.T) {
	t.Parallel()
	for _, scheme := range []string{"redis", "rediss", "REDIS"} {
		for _, tt := range malformedDSNBodies {
			t.Run(scheme+"/"+tt.name, func(t *testing.T) {
				t.Parallel()
				dsn := scheme + "://" + tt.body
				if _, _, err := redisOptions(dsn); err == nil {
					t.Fatalf("redisOptions(%q) accepted it", dsn)
				} else if strings.Contains(err.Error(), dsnPassword) {
					t.Fatalf("redisOptions(%q): the password leaked: %v", dsn, err)
				}
				for _, args := range [][]string{{"keys", "get", "k"}, {"keys", "purge"}} {
					r := runCLI(t, nil, append(args, "--store", dsn)...)
					wantExit(t, r, exitFailure, "invalid --store")
					if strings.Contains(r.Stdout+r.Stderr, dsnPassword) {
						t.Fatalf("%s: the password leaked:\n%s%s", args, r.Stdout, r.Stderr)
					}
				}
			})
		}
	}
}

// TestDSNErrorsHidePasswordOtherStores runs the same DSNs against the
// PostgreSQL, MySQL and SQLite backends.
func TestDSNErrorsHidePasswordOtherStores(t *testing.T) {
	t.Parallel()
	for _, tt := range malformedDSNBodies {
		t.Run("postgres/"+tt.name, func(t *testing.T) {
			t.Parallel()
			r := runCLI(t, nil, "keys", "get", "k", "--store", "postgres://"+tt.body)
			wantExit(t, r, exitFailure)
			if tt.name == "'/' in password" {
				// pgx, like net/url, would end the user info at the '/'
				// (host "u", port 12, database "s3cretPW@127.0.0.1:1/0"):
				// the DSN is refused before pgx parses it.
				wantExit(t, r, exitFailure, "percent-encode")
			}
			if strings.Contains(r.Stdout+r.Stderr, dsnPassword) {
				t.Fatalf("the password leaked:\n%s%s", r.Stdout, r.Stderr)
			}
		})
		t.Run("mysql/"+tt.name, func(t *testing.T) {
			t.Parallel()
			r := runCLI(t, nil, "keys", "get", "k", "--store", "mysql://"+tt.body)
			wantExit(t, r, exitFailure)
			if strings.Contains(r.Stdout+r.Stderr, dsnPassword) {
				t.Fatalf("the password leaked:\n%s%s", r.Stdout, r.Stderr)
			}
		})
		t.Run("sqlite/"+tt.name, func(t *testing.T) {
			t.Parallel()
			r := runCLI(t, nil, "keys", "get", "k", "--store", "sqlite://"+tt.body)
			wantExit(t, r, exitFailure)
			// SQLite has no credentials: everything after sqlite:// is the
			// file's path, which the error names as it is so that the user
			// can find the file. The DSN itself, repeated in the hint to
			// run migrate up, is redacted like any other.
			path := strings.Join(strings.Fields("at "+tt.body+";"), " ")
			out := strings.ReplaceAll(r.Stdout+r.Stderr, path, "at PATH;")
			if strings.Contains(out, dsnPassword) {
				t.Fatalf("the password leaked:\n%s%s", r.Stdout, r.Stderr)
			}
		})
	}
}

func TestRedactDSNSecrets(t *testing.T) {
	t.Parallel()
	tests := map[string]string{
		// unchanged
		"redis://127.0.0.1:6379/0?prefix=a:":  "redis://127.0.0.1:6379/0?prefix=a:",
		"postgres://u@h/db?sslmode=disable":   "postgres://u@h/db?sslmode=disable",
		"sqlite:///srv/app@2/idem.db":         "sqlite:///srv/app@2/idem.db",
		"sqlite://data/team@host.db":          "sqlite://data/team@host.db",
		"redis://h:6379/0?client_name=a=b":    "redis://h:6379/0?client_name=a=b",
		"postgres://h/db?passfile=/etc/pgpas": "postgres://h/db?passfile=/etc/pgpas",
		// password parameters
		"postgres://u@h/db?password=s3cretPW&sslmode=require": "postgres://u@h/db?password=xxxxx&sslmode=require",
		"postgres://u:s3cretPW@h/db?sslpassword=s3cretPW":     "postgres://u:xxxxx@h/db?sslpassword=xxxxx",
		"host=h user=u password=s3cretPW dbname=d":            "host=h user=u password=xxxxx dbname=d",
		"host=h password='s3cret PW' dbname=d":                "host=h password=xxxxx dbname=d",
		// no authority the parser can trust
		"u:s3cretPW@h:6379":             "xxxxx@h:6379",
		"redis:/u:s3cretPW@h":           "xxxxx@h",
		"redis:///u:s3cretPW@h/0":       "redis://xxxxx@h/0",
		"redis://u:12#s3cretPW@h:1/0":   "redis://xxxxx@h:1/0",
		"redis://u:12?s3cretPW@h:1/0":   "redis://xxxxx@h:1/0",
		"redis://u@h:1/s3cretPW@h:1/0":  "redis://xxxxx@h:1/0",
		"redis://u:s3cretPW@[::1":       "redis://xxxxx@[::1",
		"rediss://:s3cretPW@h:99999/0":  "rediss://:xxxxx@h:99999/0",
		"REDIS://u:s3cretPW@h:6379/0":   "redis://u:xxxxx@h:6379/0",
		"postgres://u:s3cretPW@h:1/x\n": "postgres://xxxxx@h:1/x\n",
	}
	for in, want := range tests {
		got := redactDSN(in)
		if got != want {
			t.Errorf("redactDSN(%q) = %q, want %q", in, got, want)
		}
		if strings.Contains(got, dsnPassword) || strings.Contains(got, "s3cret PW") {
			t.Errorf("redactDSN(%q) = %q keeps the password", in, got)
		}
	}
}

// A wrong password reaches the server; its refusal must not quote it.
func TestRedisWrongPasswordHidden(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(redisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("idem-no-such-user", dsnPassword)
	r := runCLI(t, nil, "keys", "get", "k", "--store", u.String())
	wantExit(t, r, exitFailure, "Redis")
	if strings.Contains(r.Stdout+r.Stderr, dsnPassword) {
		t.Fatalf("the password leaked:\n%s%s", r.Stdout, r.Stderr)
	}
}
