package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"testing"
	"time"
)

// redisURL returns IDEM_REDIS_URL; without it the test is skipped locally
// and fails in CI.
func redisURL(t *testing.T) string {
	t.Helper()
	u := os.Getenv("IDEM_REDIS_URL")
	if u == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("IDEM_REDIS_URL is not set; CI must run the Redis tests")
		}
		t.Skip("IDEM_REDIS_URL is not set; export e.g. redis://127.0.0.1:6379/0 to run the Redis tests")
	}
	return u
}

// redisTestDSN returns IDEM_REDIS_URL with a key prefix of its own. The
// tests delete the records they write; the token floor a Delete leaves
// behind expires within an hour by itself.
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
	return dsn
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
	wantExit(t, cli("keys", "purge"), exitOK)
	wantExit(t, cli("keys", "delete", "--scope", "payments", key), exitOK)
	wantExit(t, cli("keys", "get", "--scope", "payments", key), exitFailure, "not found")
	if _, err := s.Get(t.Context(), "payments", key); err == nil {
		t.Error("keys delete left the record")
	}
	wantExit(t, cli("migrate", "up"), exitFailure, "Redis stores have no schema to migrate")
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
