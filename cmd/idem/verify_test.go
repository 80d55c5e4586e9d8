package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest"
)

// quickVerify keeps the checks short in tests: the fencing check waits out
// one lease.
var quickVerify = []string{"--keys", "50", "--copies", "8", "--workers", "24", "--lease", "300ms"}

// verifyScope returns the scope verify printed.
func verifyScope(t *testing.T, out string) string {
	t.Helper()
	m := regexp.MustCompile(`under scope "([^"]+)"`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("verify did not print its scope:\n%s", out)
	}
	return m[1]
}

// openTestStore opens the store cfg names as the CLI does, closed when the
// test ends.
func openTestStore(t *testing.T, cfg storeConfig) idem.Store {
	t.Helper()
	s, closeStore, err := openStore(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = closeStore() })
	return s
}

// wantVerified checks verify's report: every check ok, and nothing left in
// its scope afterwards.
func wantVerified(t *testing.T, r cliResult, s idem.Store) {
	t.Helper()
	wantExit(t, r, exitOK)
	for _, c := range verifyChecks {
		if !regexp.MustCompile(`(?m)^ok +` + regexp.QuoteMeta(c.name) + ` `).MatchString(r.Stdout) {
			t.Fatalf("no ok line for %q:\n%s", c.name, r.Stdout)
		}
	}
	if !strings.Contains(r.Stdout, "400 calls of 50 operations from 24 goroutines: each ran once, 350 copies replayed") {
		t.Fatalf("storm line:\n%s", r.Stdout)
	}
	scope := verifyScope(t, r.Stdout)
	for _, k := range []string{"storm-0", "storm-49", "fingerprint-50", "fencing-51", "release-52", "clock-53"} {
		if _, err := s.Get(t.Context(), scope, k); !errors.Is(err, idem.ErrNotFound) {
			t.Errorf("key %q of scope %q after verify: %v, want ErrNotFound (cleaned up)", k, scope, err)
		}
	}
}

func TestVerifySQLite(t *testing.T) {
	t.Parallel()
	dsn := "sqlite://" + filepath.Join(t.TempDir(), "idem.db")
	wantExit(t, runCLI(t, nil, "migrate", "up", "--store", dsn), exitOK)
	r := runCLI(t, nil, append([]string{"verify", "--store", dsn}, quickVerify...)...)
	wantVerified(t, r, openTestStore(t, storeConfig{DSN: dsn}))
}

func TestVerifyPostgres(t *testing.T) {
	t.Parallel()
	url := postgresURL(t)
	schema := testSchema(t, url)
	wantExit(t, runCLI(t, nil, "migrate", "up", "--store", url, "--schema", schema), exitOK)
	r := runCLI(t, nil, append([]string{"verify", "--store", url, "--schema", schema}, quickVerify...)...)
	wantVerified(t, r, openTestStore(t, storeConfig{DSN: url, Schema: schema}))
}

func TestVerifyRedis(t *testing.T) {
	t.Parallel()
	dsn := redisTestDSN(t)
	r := runCLI(t, nil, append([]string{"verify", "--store", dsn}, quickVerify...)...)
	wantVerified(t, r, openTestStore(t, storeConfig{DSN: dsn}))
}

func TestVerifyUsageErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--keys", "0"}, "--keys must be 1-10000, got 0"},
		{[]string{"--keys", "10001"}, "--keys must be 1-10000"},
		{[]string{"--copies", "1"}, "--copies must be 2-100, got 1"},
		{[]string{"--workers", "1000"}, "--workers must be 1-256"},
		{[]string{"--lease", "10ms"}, "--lease must be 200ms-1m0s, got 10ms"},
		{[]string{"--wait", "0s"}, "--wait must be positive"},
		{[]string{"extra"}, "unknown command"},
	} {
		r := runCLI(t, nil, append([]string{"verify", "--store", "sqlite:///nonexistent/never-opened.db"}, c.args...)...)
		wantExit(t, r, exitUsage, c.want)
	}
}

func TestVerifyUnreachable(t *testing.T) {
	t.Parallel()
	r := runCLI(t, nil, "verify", "--store", "postgres://idem:pw@127.0.0.1:1/x")
	wantExit(t, r, exitFailure, "cannot connect to PostgreSQL at 127.0.0.1:1/x")
	if strings.Contains(r.Stderr, "pw@") {
		t.Fatalf("password echoed: %s", r.Stderr)
	}
}

// Stores that break one part of the contract each; verify must fail the
// check that covers it, and only that one.

// forgetful loses the completed records of the storm, as a Redis that
// evicts keys would, so a late copy runs again.
type forgetful struct{ idem.Store }

func (s forgetful) Complete(ctx context.Context, req idem.CompleteRequest) error {
	if err := s.Store.Complete(ctx, req); err != nil || !strings.HasPrefix(req.Key, "storm-") {
		return err
	}
	return s.Store.Delete(ctx, req.Scope, req.Key)
}

// unfenced completes with whatever token is current: a stale holder's
// result overwrites the new one's.
type unfenced struct{ idem.Store }

func (s unfenced) Complete(ctx context.Context, req idem.CompleteRequest) error {
	if rec, err := s.Get(ctx, req.Scope, req.Key); err == nil && rec.State == idem.StateInProgress {
		req.Token = rec.Token
	}
	return s.Store.Complete(ctx, req)
}

// blind ignores fingerprints: another request on a key is answered like
// the first.
type blind struct{ idem.Store }

func (s blind) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	c, err := s.Store.Claim(ctx, req)
	if err == nil && c.Outcome == idem.Mismatch {
		if c.Record.State == idem.StateCompleted {
			c.Outcome = idem.Completed
		} else {
			c.Outcome = idem.InProgress
		}
	}
	return c, err
}

// sticky says yes to the holder's release but keeps the lease, so the key
// does not run again until the lease expires.
type sticky struct{ idem.Store }

func (s sticky) Release(ctx context.Context, scope, key string, token int64) error {
	if rec, err := s.Get(ctx, scope, key); err == nil && rec.Token == token {
		return nil
	}
	return s.Store.Release(ctx, scope, key, token)
}

func TestVerifyCatchesBrokenStores(t *testing.T) {
	t.Parallel()
	o := verifyOptions{keys: 40, copies: 6, workers: 16, lease: 250 * time.Millisecond, wait: 10 * time.Second}
	mem := func() idem.Store {
		return idemtest.NewMemoryStore(nil)
	}
	for _, c := range []struct {
		name   string
		store  idem.Store
		failed []string
		detail string
	}{
		{"correct", mem(), nil, ""},
		{"forgetful", forgetful{mem()}, []string{"duplicate storm"}, "times, want exactly once"},
		{"unfenced", unfenced{mem()}, []string{"fencing"}, "complete by the old holder: <nil>, want ErrLeaseLost"},
		{"blind", blind{mem()}, []string{"fingerprint"}, "another request on a key in progress: in_progress, want mismatch"},
		{"sticky", sticky{mem()}, []string{"release"}, "claim after release: in_progress"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var out bytes.Buffer
			err := runVerify(t.Context(), &out, c.store, o)
			if len(c.failed) == 0 {
				if err != nil {
					t.Fatalf("a correct store failed verify: %v\n%s", err, out.String())
				}
				return
			}
			if !errors.Is(err, errVerifyFailed) || !strings.Contains(err.Error(), "1 of 5 checks failed") {
				t.Fatalf("verify = %v, want 1 of 5 checks failed\n%s", err, out.String())
			}
			for _, chk := range verifyChecks {
				failed := regexp.MustCompile(`(?m)^FAIL +` + regexp.QuoteMeta(chk.name) + ` `).MatchString(out.String())
				want := chk.name == c.failed[0]
				if failed != want {
					t.Fatalf("check %q failed=%v, want %v:\n%s", chk.name, failed, want, out.String())
				}
			}
			if !strings.Contains(out.String(), c.detail) {
				t.Fatalf("report lacks %q:\n%s", c.detail, out.String())
			}
		})
	}
}

// TestVerifyCancelled: a verification cut short (Ctrl-C) says so, not that
// the store broke its contract, exits 130 and deletes what it wrote.
func TestVerifyCancelled(t *testing.T) {
	t.Parallel()
	for _, keep := range []bool{false, true} {
		store := idemtest.NewMemoryStore(nil)
		ctx, cancel := context.WithCancel(t.Context())
		var out lockedBuffer
		o := verifyOptions{keys: 2000, copies: 20, workers: 4, lease: time.Second, wait: time.Second, keep: keep,
			store: "SQLite store sqlite://x.db", progress: time.Millisecond}
		go func() {
			// Interrupt the storm once it has made progress.
			for !strings.Contains(out.String(), "storm: ") {
				time.Sleep(time.Millisecond)
			}
			cancel()
		}()
		err := runVerify(ctx, &out, store, o)
		var ce exitCodeError
		if !errors.As(err, &ce) || ce.code != exitInterrupted || errors.Is(err, errVerifyFailed) ||
			!strings.Contains(out.String(), "interrupted during duplicate storm") || strings.Contains(out.String(), "FAIL") {
			t.Fatalf("keep=%v: verify interrupted = %v\n%s", keep, err, out.String())
		}
		if !strings.Contains(out.String(), "verifying SQLite store sqlite://x.db under scope") {
			t.Errorf("the report does not name the store:\n%s", out.String())
		}
		scope := regexp.MustCompile(`under scope "([^"]+)"`).FindStringSubmatch(out.String())[1]
		left := 0
		for i := range 2000 {
			if _, err := store.Get(t.Context(), scope, fmt.Sprintf("storm-%d", i)); err == nil {
				left++
			}
		}
		switch {
		case !keep && (left != 0 || !strings.Contains(err.Error(), "were deleted")):
			t.Errorf("interrupted verify left %d records (%v)", left, err)
		case keep && (left == 0 || !strings.Contains(err.Error(), "are kept")):
			t.Errorf("interrupted verify --keep kept %d records (%v)", left, err)
		}
		cancel()
	}
}

// lockedBuffer is a bytes.Buffer safe for a writer and a reader at once.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestVerifyProgressLine(t *testing.T) {
	t.Parallel()
	if got := progressLine(0, 100, time.Second, false); got != "storm: 0/100 calls\n" {
		t.Errorf("progressLine at 0 = %q", got)
	}
	if got := progressLine(250, 1000, 5*time.Second, false); got != "storm: 250/1000 calls (50/s, about 15s left)\n" {
		t.Errorf("progressLine = %q", got)
	}
	if got := progressLine(250, 1000, 5*time.Second, true); !strings.HasPrefix(got, "\r\033[K") || strings.HasSuffix(got, "\n") {
		t.Errorf("progressLine on a terminal = %q", got)
	}
}

// TestVerifyFlagValues: values that are not numbers or durations say what
// the flag wants, from the command line and from the environment, without
// the parser's words.
func TestVerifyFlagValues(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{map[string]string{"IDEM_VERIFY_KEYS": "abc"}, nil, `invalid value "abc" in IDEM_VERIFY_KEYS for --keys: want a whole number`},
		{nil, []string{"--keys", "abc"}, `invalid value "abc" for --keys: want a whole number`},
		{nil, []string{"--lease", "5"}, `invalid value "5" for --lease: want a duration such as 500ms, 30s or 2m`},
		{map[string]string{"IDEM_VERIFY_KEEP": "maybe"}, nil, `invalid value "maybe" in IDEM_VERIFY_KEEP for --keep: want true or false`},
	} {
		r := runCLI(t, c.env, append([]string{"verify", "--store", "sqlite:///nonexistent/x.db"}, c.args...)...)
		wantExit(t, r, exitUsage, c.want)
		if strings.Contains(r.Stderr, "strconv") || strings.Contains(r.Stderr, "time: ") {
			t.Errorf("%v %v: the parser's words leaked: %s", c.env, c.args, r.Stderr)
		}
	}
}

// undeletable refuses to delete: verify passes its checks but must report
// that it could not clean up.
type undeletable struct{ idem.Store }

func (undeletable) Delete(context.Context, string, string) error {
	return errors.New("READONLY replica")
}

// noExpiry reports no lease expiry, which the store clock check refuses.
type noExpiry struct{ idem.Store }

func (s noExpiry) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	c, err := s.Store.Claim(ctx, req)
	c.LeaseExpiresAt = time.Time{}
	return c, err
}

func TestVerifyCleanupAndClockFailures(t *testing.T) {
	t.Parallel()
	o := verifyOptions{keys: 5, copies: 2, workers: 4, lease: 250 * time.Millisecond, wait: 10 * time.Second}
	var out bytes.Buffer
	err := runVerify(t.Context(), &out, undeletable{idemtest.NewMemoryStore(nil)}, o)
	if !errors.Is(err, errVerifyFailed) || !strings.Contains(err.Error(), "every check passed, but the cleanup") ||
		!strings.Contains(out.String(), "READONLY replica") {
		t.Fatalf("verify with a store that cannot delete = %v\n%s", err, out.String())
	}
	out.Reset()
	err = runVerify(t.Context(), &out, noExpiry{idemtest.NewMemoryStore(nil)}, o)
	if !errors.Is(err, errVerifyFailed) || !strings.Contains(out.String(), "the store reported no lease expiry") {
		t.Fatalf("verify with a store that reports no expiry = %v\n%s", err, out.String())
	}
}

// TestVerifyJSON: --json prints one report, checks and failures included,
// and nothing else on stdout.
func TestVerifyJSON(t *testing.T) {
	t.Parallel()
	o := verifyOptions{keys: 5, copies: 2, workers: 4, lease: 250 * time.Millisecond, wait: 10 * time.Second, json: true,
		store: "SQLite store sqlite://x.db", progress: time.Millisecond}
	var out bytes.Buffer
	err := runVerify(t.Context(), &out, noExpiry{idemtest.NewMemoryStore(nil)}, o)
	var rep verifyReport
	if jerr := json.Unmarshal(out.Bytes(), &rep); jerr != nil || !errors.Is(err, errVerifyFailed) {
		t.Fatalf("verify --json = %v; output is not one JSON document (%v):\n%s", err, jerr, out.String())
	}
	failed := 0
	for _, c := range rep.Checks {
		if !c.OK {
			failed++
			if c.Error == "" || c.Name != "store clock" {
				t.Errorf("failed check %+v", c)
			}
		}
	}
	if rep.Passed || failed != 1 || len(rep.Checks) != len(verifyChecks) || rep.Store != o.store || !strings.HasPrefix(rep.Scope, "idem-verify/") {
		t.Fatalf("report %+v", rep)
	}
}
