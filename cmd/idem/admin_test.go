package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/contrib/idemprom"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/idem-go/idem/store/idemsqlite"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"
)

// startTestAdmin starts an admin server on a free loopback port and stops
// it when the test ends.
func startTestAdmin(t *testing.T, cfg adminConfig) *adminServer {
	t.Helper()
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	a, err := startAdmin(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := a.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	return a
}

// adminGet requests path from the admin server on a connection of its own.
func adminGet(t *testing.T, a *adminServer, method, path string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, "http://"+a.Addr()+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Minute}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", method, path, err)
	}
	return resp.StatusCode, string(body), resp.Header
}

// getReadyz requests /readyz and decodes its body.
func getReadyz(t *testing.T, a *adminServer) (int, readyzBody) {
	t.Helper()
	code, body, h := adminGet(t, a, http.MethodGet, "/readyz")
	if ct := h.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("/readyz Content-Type %q", ct)
	}
	var rb readyzBody
	if err := json.Unmarshal([]byte(body), &rb); err != nil {
		t.Fatalf("/readyz body %q: %v", body, err)
	}
	return code, rb
}

// wantReady fails unless /readyz answers code with every check in oks
// passing and every check in fails failing with an error containing the
// given fragment.
func wantReady(t *testing.T, a *adminServer, code int, oks []string, fails map[string]string) readyzBody {
	t.Helper()
	got, rb := getReadyz(t, a)
	if got != code {
		t.Fatalf("/readyz = %d %+v, want %d", got, rb, code)
	}
	wantStatus := map[int]string{http.StatusOK: "ok", http.StatusServiceUnavailable: "unavailable"}[code]
	if rb.Status != wantStatus {
		t.Fatalf("/readyz status %q, want %q: %+v", rb.Status, wantStatus, rb)
	}
	for _, name := range oks {
		if rb.Checks[name] != "ok" {
			t.Errorf("check %s = %q, want ok", name, rb.Checks[name])
		}
	}
	for name, frag := range fails {
		if msg := rb.Checks[name]; msg == "ok" || !strings.Contains(msg, frag) {
			t.Errorf("check %s = %q, want an error containing %q", name, msg, frag)
		}
	}
	if len(rb.Checks) != len(oks)+len(fails) {
		t.Errorf("/readyz lists %d checks, want %d: %+v", len(rb.Checks), len(oks)+len(fails), rb.Checks)
	}
	return rb
}

// adminSQLiteStore returns a migrated SQLite store in a temporary directory.
func adminSQLiteStore(t *testing.T) *idemsqlite.Store {
	t.Helper()
	s, err := idemsqlite.Open(t.Context(), "sqlite://"+filepath.Join(t.TempDir(), "idem.db"), &idemsqlite.Config{
		AutoMigrate: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// upstreamURL returns the URL of a running test upstream.
func upstreamURL(t *testing.T) *url.URL {
	t.Helper()
	up := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(up.Close)
	u, err := url.Parse(up.URL)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// closedPortURL returns an http URL on a loopback port nothing listens on.
func closedPortURL(t *testing.T) *url.URL {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return &url.URL{Scheme: "http", Host: addr}
}

func TestAdminHealthzAndUnknownPaths(t *testing.T) {
	t.Parallel()
	a := startTestAdmin(t, adminConfig{Checks: []readyCheck{{"never", func(context.Context) error { return errors.New("down") }}}})
	code, body, h := adminGet(t, a, http.MethodGet, "/healthz")
	if code != http.StatusOK || body != "ok\n" || !strings.HasPrefix(h.Get("Content-Type"), "text/plain") {
		t.Fatalf("/healthz = %d %q (%s), want 200 ok", code, body, h.Get("Content-Type"))
	}
	// Liveness does not depend on the failing readiness check.
	if code, _, _ := adminGet(t, a, http.MethodHead, "/healthz"); code != http.StatusOK {
		t.Fatalf("HEAD /healthz = %d", code)
	}
	if code, _, _ := adminGet(t, a, http.MethodPost, "/healthz"); code != http.StatusMethodNotAllowed {
		t.Fatalf("POST /healthz = %d, want 405", code)
	}
	for _, p := range []string{"/", "/nope", "/healthz/x", "/readyz/", "/metrics/x", "/debug/pprof/"} {
		if code, _, _ := adminGet(t, a, http.MethodGet, p); code != http.StatusNotFound {
			t.Errorf("GET %s = %d, want 404", p, code)
		}
	}
}

func TestAdminReadySQLiteAndUpstream(t *testing.T) {
	t.Parallel()
	a := startTestAdmin(t, adminConfig{Checks: []readyCheck{storeReady(adminSQLiteStore(t)), upstreamReady(upstreamURL(t))}})
	wantReady(t, a, http.StatusOK, []string{"store", "upstream"}, nil)
}

func TestAdminReadyUpstreamDown(t *testing.T) {
	t.Parallel()
	a := startTestAdmin(t, adminConfig{Checks: []readyCheck{storeReady(adminSQLiteStore(t)), upstreamReady(closedPortURL(t))}})
	wantReady(t, a, http.StatusServiceUnavailable, []string{"store"}, map[string]string{"upstream": "connection refused"})
}

func TestAdminUpstreamDefaultPorts(t *testing.T) {
	t.Parallel()
	// The check dials host:port; a scheme without a port picks the
	// default. Dial a closed loopback port to see the address it chose.
	for scheme, port := range map[string]string{"http": "80", "https": "443"} {
		u := &url.URL{Scheme: scheme, Host: "127.0.0.1"}
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		err := upstreamReady(u).Check(ctx)
		cancel()
		if err != nil && !strings.Contains(err.Error(), "127.0.0.1:"+port) {
			t.Errorf("%s: %v does not name port %s", scheme, err, port)
		}
	}
}

func TestAdminReadySQLiteNotMigrated(t *testing.T) {
	t.Parallel()
	up := upstreamURL(t)

	t.Run("migrations reverted", func(t *testing.T) {
		t.Parallel()
		s := adminSQLiteStore(t)
		a := startTestAdmin(t, adminConfig{Checks: []readyCheck{storeReady(s), upstreamReady(up)}})
		wantReady(t, a, http.StatusOK, []string{"store", "upstream"}, nil)
		m, err := idemsqlite.NewMigrator(s.DB())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.Down(t.Context(), idemsqlite.LatestVersion()); err != nil {
			t.Fatal(err)
		}
		wantReady(t, a, http.StatusServiceUnavailable, []string{"upstream"}, map[string]string{"store": "not migrated (at version 0"})
	})
	t.Run("records table dropped", func(t *testing.T) {
		t.Parallel()
		s := adminSQLiteStore(t)
		if _, err := s.DB().ExecContext(t.Context(), "DROP TABLE idem_records"); err != nil {
			t.Fatal(err)
		}
		a := startTestAdmin(t, adminConfig{Checks: []readyCheck{storeReady(s)}})
		wantReady(t, a, http.StatusServiceUnavailable, nil, map[string]string{"store": "no such table"})
	})
	t.Run("store closed", func(t *testing.T) {
		t.Parallel()
		s := adminSQLiteStore(t)
		a := startTestAdmin(t, adminConfig{Checks: []readyCheck{storeReady(s)}})
		s.Close()
		wantReady(t, a, http.StatusServiceUnavailable, nil, map[string]string{"store": "closed"})
	})
}

// failingStore is a store whose every call fails with err.
type failingStore struct {
	idem.Store
	err error
}

func (f failingStore) Get(context.Context, string, string) (idem.Record, error) {
	return idem.Record{}, f.err
}

func TestAdminReadyFailingStoreRedacted(t *testing.T) {
	t.Parallel()
	err := errors.New("cannot reach postgres://app:" + dsnPassword + "@db:5432/x\n(host=db password=" + dsnPassword + " sslmode=disable)" +
		strings.Repeat(" and more", 100))
	a := startTestAdmin(t, adminConfig{Checks: []readyCheck{storeReady(failingStore{err: err}), upstreamReady(upstreamURL(t))}})
	rb := wantReady(t, a, http.StatusServiceUnavailable, []string{"upstream"},
		map[string]string{"store": "cannot reach postgres://app:xxxxx@db:5432/x (host=db password=xxxxx sslmode=disable)"})
	if msg := rb.Checks["store"]; strings.Contains(msg, dsnPassword) || strings.Contains(msg, "\n") || len(msg) > 300 {
		t.Fatalf("store error %q is not one short redacted line", msg)
	}
	// A record under the probe key is as good as none: the store answered.
	found := failingStore{err: nil}
	b := startTestAdmin(t, adminConfig{Checks: []readyCheck{storeReady(found)}})
	wantReady(t, b, http.StatusOK, []string{"store"}, nil)
	notFound := failingStore{err: errors.Join(errors.New("nothing there"), idem.ErrNotFound)}
	c := startTestAdmin(t, adminConfig{Checks: []readyCheck{storeReady(notFound)}})
	wantReady(t, c, http.StatusOK, []string{"store"}, nil)
}

// The memory store is exercised by the generic probe too.
func TestAdminReadyMemoryStore(t *testing.T) {
	t.Parallel()
	a := startTestAdmin(t, adminConfig{Checks: []readyCheck{storeReady(idemtest.NewMemoryStore(nil))}})
	wantReady(t, a, http.StatusOK, []string{"store"}, nil)
}

func TestAdminReadyTimeoutsAndPanics(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	a := startTestAdmin(t, adminConfig{
		CheckTimeout: time.Second,
		Checks: []readyCheck{
			{"waits", func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }},
			{"deaf", func(context.Context) error { <-release; return nil }},
			{"panics", func(context.Context) error { panic("boom") }},
			{"fine", func(context.Context) error { return nil }},
		},
	})
	wantReady(t, a, http.StatusServiceUnavailable, []string{"fine"}, map[string]string{
		"waits":  "timed out after 1s",
		"deaf":   "timed out after 1s",
		"panics": "check panicked: boom",
	})
	once.Do(func() { close(release) })
}

func TestAdminDraining(t *testing.T) {
	t.Parallel()
	a := startTestAdmin(t, adminConfig{Checks: []readyCheck{upstreamReady(upstreamURL(t))}})
	wantReady(t, a, http.StatusOK, []string{"upstream"}, nil)
	a.SetDraining()
	a.SetDraining() // idempotent
	code, rb := getReadyz(t, a)
	if code != http.StatusServiceUnavailable || rb.Status != "draining" {
		t.Fatalf("/readyz while draining = %d %+v, want 503 draining", code, rb)
	}
	if code, _, _ := adminGet(t, a, http.MethodGet, "/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz while draining = %d, want 200", code)
	}
}

// Concurrent probes share one evaluation of the checks.
func TestAdminReadyCoalesces(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	started, release := make(chan struct{}), make(chan struct{})
	a := startTestAdmin(t, adminConfig{
		CheckTimeout: maxAdminCheckTimeout,
		Checks: []readyCheck{{"slow", func(ctx context.Context) error {
			if calls.Add(1) == 1 {
				close(started)
			}
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}}},
	})
	const n = 5
	codes := make(chan int, n)
	go func() { code, _ := getReadyz(t, a); codes <- code }()
	<-started
	for range n - 1 {
		go func() { code, _ := getReadyz(t, a); codes <- code }()
	}
	// Release the check once every other request waits for the run.
	for {
		a.mu.Lock()
		joined := a.run != nil && a.run.joined == n-1
		a.mu.Unlock()
		if joined {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(release)
	for range n {
		if code := <-codes; code != http.StatusOK {
			t.Errorf("/readyz = %d", code)
		}
	}
	if c := calls.Load(); c != 1 {
		t.Fatalf("%d concurrent probes ran the check %d times, want once", n, c)
	}
	// The next probe runs the checks again.
	wantReady(t, a, http.StatusOK, []string{"slow"}, nil)
	if c := calls.Load(); c != 2 {
		t.Fatalf("check ran %d times, want 2", c)
	}
}

func TestAdminMetrics(t *testing.T) {
	t.Parallel()
	reg := newAdminRegistry()
	m, err := idemprom.New(reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodPost, "/orders", nil)
	m.OnRequestEnd(req.Context(), idemhttp.Event{Request: req, Outcome: idem.Duplicate, Status: http.StatusCreated, Duration: 3 * time.Millisecond})
	a := startTestAdmin(t, adminConfig{Registry: reg})
	code, body, h := adminGet(t, a, http.MethodGet, "/metrics")
	if code != http.StatusOK || !strings.HasPrefix(h.Get("Content-Type"), "text/plain") {
		t.Fatalf("/metrics = %d (%s)", code, h.Get("Content-Type"))
	}
	for _, w := range []string{
		`idem_http_requests_total{outcome="duplicate",status_class="2xx"} 1`,
		`idem_http_request_duration_seconds_count{outcome="duplicate"} 1`,
		"go_goroutines ", "go_memstats_heap_alloc_bytes ", "process_cpu_seconds_total ", "process_open_fds ",
	} {
		if !strings.Contains(body, w) {
			t.Errorf("/metrics lacks %q", w)
		}
	}
	// Without a registry the admin server still serves the runtime metrics.
	b := startTestAdmin(t, adminConfig{})
	if _, body, _ := adminGet(t, b, http.MethodGet, "/metrics"); !strings.Contains(body, "go_goroutines ") {
		t.Errorf("/metrics of the default registry lacks go_goroutines")
	}
}

func TestAdminRefusesPublicAddr(t *testing.T) {
	t.Parallel()
	same := [][2]string{
		{"127.0.0.1:8080", "127.0.0.1:8080"},
		{"0.0.0.0:8080", "127.0.0.1:8080"},
		{":8080", "127.0.0.1:8080"},
		{"127.0.0.1:8080", "[::]:8080"},
		{"localhost:8080", "127.0.0.1:8080"},
		{"[::1]:8080", "localhost:8080"},
		{"LOCALHOST:8080", "localhost:8080"},
		{"127.0.0.1:http", "127.0.0.1:80"},
		{"[::ffff:127.0.0.1]:8080", "127.0.0.1:8080"},
		{"api.internal:8080", "API.internal:8080"},
	}
	for _, p := range same {
		if !sameListenAddr(p[0], p[1]) || !sameListenAddr(p[1], p[0]) {
			t.Errorf("sameListenAddr(%q, %q) = false", p[0], p[1])
		}
		_, err := startAdmin(t.Context(), adminConfig{Addr: p[0], PublicAddr: p[1]})
		if err == nil || !strings.Contains(err.Error(), "public listen address") {
			t.Errorf("startAdmin(%q) with public %q: %v", p[0], p[1], err)
		}
	}
	different := [][2]string{
		{"127.0.0.1:9090", "127.0.0.1:8080"},
		{"127.0.0.1:0", "127.0.0.1:0"}, // two free ports, never the same
		{"127.0.0.1:8080", "127.0.0.2:8080"},
		{"10.0.0.1:8080", "10.0.0.2:8080"},
		{"localhost:8080", "10.0.0.1:8080"},
	}
	for _, p := range different {
		if sameListenAddr(p[0], p[1]) || sameListenAddr(p[1], p[0]) {
			t.Errorf("sameListenAddr(%q, %q) = true", p[0], p[1])
		}
	}
	// A different port is accepted.
	startTestAdmin(t, adminConfig{PublicAddr: "127.0.0.1:8080"})
}

func TestAdminConfigErrors(t *testing.T) {
	t.Parallel()
	ok := func(context.Context) error { return nil }
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	tests := []struct {
		cfg  adminConfig
		want string
	}{
		{adminConfig{}, "empty listen address"},
		{adminConfig{Addr: "127.0.0.1:0", Checks: []readyCheck{{"a", ok}, {"a", ok}}}, `"a" given twice`},
		{adminConfig{Addr: "127.0.0.1:0", Checks: []readyCheck{{"", ok}}}, "no name"},
		{adminConfig{Addr: "127.0.0.1:0", Checks: []readyCheck{{"a", nil}}}, "no function"},
		{adminConfig{Addr: "127.0.0.1:0", CheckTimeout: time.Hour}, "timeout"},
		{adminConfig{Addr: "127.0.0.1:0", CheckTimeout: -time.Second}, "timeout"},
		{adminConfig{Addr: busy.Addr().String()}, "listen on " + busy.Addr().String()},
	}
	for _, tt := range tests {
		a, err := startAdmin(t.Context(), tt.cfg)
		if err == nil {
			a.Stop(t.Context())
			t.Errorf("startAdmin(%+v) started", tt.cfg)
		} else if !strings.Contains(err.Error(), tt.want) {
			t.Errorf("startAdmin(%+v) = %v, want %q", tt.cfg, err, tt.want)
		}
	}
}

// TestAdminServerTimeouts: the admin server sets every connection limit.
func TestAdminServerTimeouts(t *testing.T) {
	t.Parallel()
	a := startTestAdmin(t, adminConfig{})
	s := a.srv
	if s.ReadHeaderTimeout <= 0 || s.ReadTimeout <= 0 || s.WriteTimeout <= 0 || s.IdleTimeout <= 0 || s.MaxHeaderBytes <= 0 {
		t.Fatalf("admin server limits not all set: %+v", s)
	}
	if s.WriteTimeout <= maxAdminCheckTimeout {
		t.Fatalf("write timeout %v does not leave room for a %v check", s.WriteTimeout, maxAdminCheckTimeout)
	}
}

// TestAdminStopLeaksNothing runs alone (not in parallel) so that it can
// compare goroutines before and after: Stop ends a readiness check in
// flight, closes kept-alive connections and returns with every goroutine
// of the server gone.
func TestAdminStopLeaksNothing(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	started := make(chan struct{})
	var once sync.Once
	a, err := startAdmin(t.Context(), adminConfig{
		Addr:         "127.0.0.1:0",
		CheckTimeout: maxAdminCheckTimeout,
		Checks: []readyCheck{{"blocks", func(ctx context.Context) error {
			once.Do(func() { close(started) })
			<-ctx.Done()
			return ctx.Err()
		}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	// A kept-alive connection stays open after this request.
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: time.Minute}
	resp, err := client.Get("http://" + a.Addr() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	// A probe whose check is still running when Stop is called.
	type result struct {
		code int
		body string
		err  error
	}
	probe := make(chan result, 1)
	go func() {
		resp, err := client.Get("http://" + a.Addr() + "/readyz")
		if err != nil {
			probe <- result{err: err}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		probe <- result{code: resp.StatusCode, body: string(b)}
	}()
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := a.Stop(ctx); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if err := a.Stop(ctx); err != nil {
		t.Fatalf("second stop: %v", err)
	}
	r := <-probe
	if r.err != nil || r.code != http.StatusServiceUnavailable || !strings.Contains(r.body, "stopping") {
		t.Fatalf("probe during stop = %d %q %v, want 503 naming the stop", r.code, r.body, r.err)
	}
	if _, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Get("http://" + a.Addr() + "/healthz"); err == nil {
		t.Fatal("the admin server still answers after Stop")
	}
	tr.CloseIdleConnections()
}

func TestAdminReadyPostgres(t *testing.T) {
	t.Parallel()
	pgURL := postgresURL(t)
	schema := testSchema(t, pgURL)
	wantExit(t, runCLI(t, nil, "migrate", "up", "--store", pgURL, "--schema", schema), exitOK)
	s, closeStore, err := openStore(t.Context(), storeConfig{DSN: pgURL, Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer closeStore()
	if _, ok := s.(*idempgx.Store); !ok {
		t.Fatalf("openStore returned %T", s)
	}
	up := upstreamURL(t)
	a := startTestAdmin(t, adminConfig{Checks: []readyCheck{storeReady(s), upstreamReady(up)}})
	wantReady(t, a, http.StatusOK, []string{"store", "upstream"}, nil)

	// A schema nobody migrated.
	pool, err := pgxpool.New(t.Context(), pgURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	bare, err := idempgx.New(pool, &idempgx.Config{Schema: testSchema(t, pgURL)})
	if err != nil {
		t.Fatal(err)
	}
	b := startTestAdmin(t, adminConfig{Checks: []readyCheck{storeReady(bare), upstreamReady(up)}})
	wantReady(t, b, http.StatusServiceUnavailable, []string{"upstream"}, map[string]string{"store": "is not migrated"})
}

func TestAdminReadyRedis(t *testing.T) {
	t.Parallel()
	s, closeStore, err := openStore(t.Context(), storeConfig{DSN: redisTestDSN(t)})
	if err != nil {
		t.Fatal(err)
	}
	a := startTestAdmin(t, adminConfig{Checks: []readyCheck{storeReady(s), upstreamReady(upstreamURL(t))}})
	wantReady(t, a, http.StatusOK, []string{"store", "upstream"}, nil)
	closeStore()
	wantReady(t, a, http.StatusServiceUnavailable, []string{"upstream"}, map[string]string{"store": "clos"})
}
