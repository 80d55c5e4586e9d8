package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
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
		wantExit(t, r, exitFailure, "has no inbox", "sqlite:// or postgres://")
	}
}
