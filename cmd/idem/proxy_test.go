package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer safe to read while a command writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var listenRE = regexp.MustCompile(`listening on (\S+),`)

// waitListening polls out until the proxy prints its address.
func waitListening(t *testing.T, out interface{ String() string }, done <-chan struct{}) string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if m := listenRE.FindStringSubmatch(out.String()); m != nil {
			return "http://" + m[1]
		}
		select {
		case <-done:
			t.Fatalf("proxy exited before listening: %s", out.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatalf("proxy did not start: %s", out.String())
	return ""
}

// migratedSQLite returns the DSN of a fresh, migrated SQLite store.
func migratedSQLite(t *testing.T) string {
	t.Helper()
	dsn := "sqlite://" + filepath.Join(t.TempDir(), "proxy.db")
	wantExit(t, runCLI(t, nil, "migrate", "up", "--store", dsn), exitOK)
	return dsn
}

// orderAPI is a non-idempotent upstream: every call creates an order.
type orderAPI struct {
	calls atomic.Int64
	delay time.Duration
	mu    sync.Mutex
	keys  []string
	block chan struct{} // when set, requests with key "block" wait on it
	// unblocked makes "block" requests proceed without waiting.
	unblocked atomic.Bool
}

func (u *orderAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := u.calls.Add(1)
	u.mu.Lock()
	u.keys = append(u.keys, r.Header.Get("Idempotency-Key"))
	u.mu.Unlock()
	if u.block != nil && !u.unblocked.Load() && r.Header.Get("Idempotency-Key") == "block" {
		select {
		case <-u.block:
		case <-r.Context().Done():
			return
		}
	}
	time.Sleep(u.delay)
	b, _ := io.ReadAll(r.Body)
	w.Header().Set("Location", fmt.Sprintf("/orders/%d", n))
	w.Header().Set("Set-Cookie", "s=1")
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"order":%d,"bytes":%d}`, n, len(b))
}

type proxyResponse struct {
	status int
	header http.Header
	body   string
}

func postKey(t *testing.T, client *http.Client, base, key, auth, body string) proxyResponse {
	t.Helper()
	return postHeaders(t, client, base, body, map[string]string{"Idempotency-Key": key, "Authorization": auth})
}

// postHeaders POSTs a JSON body with the non-empty headers given.
func postHeaders(t *testing.T, client *http.Client, base, body string, headers map[string]string) proxyResponse {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+"/orders", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		if v != "" {
			req.Header.Set(k, v)
		}
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Errorf("POST: %v", err)
		return proxyResponse{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return proxyResponse{resp.StatusCode, resp.Header, string(b)}
}

func TestProxyFlags(t *testing.T) {
	t.Parallel()
	wantExit(t, runCLI(t, nil, "proxy"), exitUsage, "--upstream is required")
	wantExit(t, runCLI(t, nil, "proxy", "--upstream", "ftp://x"), exitUsage, "invalid --upstream")
	wantExit(t, runCLI(t, nil, "proxy", "--upstream", "http://x", "--max-body", "lots"), exitUsage, "--max-body")
	wantExit(t, runCLI(t, nil, "proxy", "--upstream", "http://x", "--lease", "0s"), exitUsage, "--lease must be positive")
	wantExit(t, runCLI(t, nil, "proxy", "--upstream", "http://x", "--lease", "1ns"), exitUsage, "--lease 1ns is too short")
	wantExit(t, runCLI(t, nil, "proxy", "--upstream", "http://x", "--in-doubt", "retry"), exitUsage, `invalid --in-doubt "retry"`)
	wantExit(t, runCLI(t, nil, "proxy", "--upstream", "http://x", "--error-format", "xml"), exitUsage, `invalid --error-format "xml"`)
	wantExit(t, runCLI(t, nil, "proxy", "--upstream", "http://x", "--max-conns", "-1"), exitUsage, "--max-conns must not be negative")
	wantExit(t, runCLI(t, nil, "proxy", "--upstream", "http://x", "--body-timeout", "-1s"), exitUsage, "--body-timeout must not be negative")
	wantExit(t, runCLI(t, nil, "proxy", "--upstream", "http://x", "--replay-cache", "-1s"), exitUsage, "--replay-cache must not be negative")
	wantExit(t, runCLI(t, nil, "proxy", "--upstream", "http://x", "--replay-cache", "2m"), exitUsage, "--replay-cache 2m0s is too long")
	wantExit(t, runCLI(t, nil, "proxy", "--upstream", "http://x", "--listen", "127.0.0.1:9", "--admin-listen", "127.0.0.1:9"),
		exitUsage, "--admin-listen must differ")
	if r := runCLI(t, nil, "proxy", "--upstream", "http://u:s3cret@[::1"); strings.Contains(r.Stderr+r.Stdout, "s3cret") {
		t.Errorf("an invalid --upstream echoes its password: %s", r.Stderr)
	}
	wantExit(t, runCLI(t, map[string]string{"IDEM_PROXY_UPSTREAM": "nope"}, "proxy"), exitUsage, "invalid --upstream")
	wantExit(t, runCLI(t, nil, "proxy", "--upstream", "http://x", "--store", "sqlite://"+filepath.Join(t.TempDir(), "missing.db")),
		exitFailure, "no SQLite database")
	for in, want := range map[string]int64{"1MiB": 1 << 20, "512KiB": 512 << 10, "2MB": 2e6, "100": 100, "7B": 7} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "0", "-1MiB", "1TiB", "MiB", "2000GiB"} {
		if _, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) accepted", in)
		}
	}
}

// inProcessProxy runs "idem proxy args…" in-process on a free port and
// returns its base URL and a function that stops it (as SIGTERM does) and
// returns the exit code and everything logged.
func inProcessProxy(t *testing.T, args ...string) (base string, stop func() (int, string)) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	var stdout, stderr syncBuffer
	done := make(chan struct{})
	var code int
	go func() {
		defer close(done)
		code = runEnv(ctx, append([]string{"proxy", "--listen", "127.0.0.1:0"}, args...),
			&stdout, &stderr, func(string) string { return "" })
	}()
	t.Cleanup(func() { cancel(); <-done })
	base = waitListening(t, &stdout, done)
	return base, func() (int, string) {
		cancel()
		<-done
		return code, stderr.String()
	}
}

// burst sends n parallel POSTs with one key and checks the acceptance: one
// upstream request, every response the original or a 409 with Retry-After,
// then replays with the stored headers and a 422 for another body. It
// returns the original body.
func burst(t *testing.T, client *http.Client, base string, api *orderAPI, n int) string {
	t.Helper()
	const body = `{"sku":"x","qty":1}`
	before := api.calls.Load()
	res := make([]proxyResponse, n)
	var wg sync.WaitGroup
	for i := range res {
		wg.Go(func() { res[i] = postKey(t, client, base, `"order-1"`, "Bearer A", body) })
	}
	wg.Wait()
	if got := api.calls.Load() - before; got != 1 {
		t.Fatalf("upstream received %d requests, want 1", got)
	}
	var original string
	for _, r := range res {
		switch r.status {
		case http.StatusCreated:
			if original == "" {
				original = r.body
			} else if r.body != original {
				t.Fatalf("body %q differs from %q", r.body, original)
			}
		case http.StatusConflict:
			if r.header.Get("Retry-After") == "" {
				t.Fatal("409 without Retry-After")
			}
		default:
			t.Fatalf("status %d: %s", r.status, r.body)
		}
	}
	for range 3 {
		r := postKey(t, client, base, `"order-1"`, "Bearer A", `{ "qty": 1, "sku": "x" }`)
		if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" ||
			!strings.HasPrefix(r.header.Get("Location"), "/orders/") || r.header.Get("Set-Cookie") != "" {
			t.Fatalf("retry: %d %q %v", r.status, r.body, r.header)
		}
		if original == "" {
			original = r.body // every burst response was a 409
		} else if r.body != original {
			t.Fatalf("retry body %q, want %q", r.body, original)
		}
	}
	if r := postKey(t, client, base, `"order-1"`, "Bearer A", `{"sku":"y","qty":1}`); r.status != http.StatusUnprocessableEntity {
		t.Fatalf("different body: %d", r.status)
	}
	if got := api.calls.Load() - before; got != 1 {
		t.Fatalf("upstream received %d requests, want 1", got)
	}
	return original
}

// The acceptance: 100 parallel POSTs with one key through the proxy
// on a durable store → one upstream request; then replays; principals
// isolated; graceful stop with a request in flight.
func TestProxyInProcess(t *testing.T) {
	t.Parallel()
	api := &orderAPI{delay: 100 * time.Millisecond, block: make(chan struct{})}
	up := httptest.NewServer(api)
	defer up.Close()
	// A 100-way burst queues every claim behind SQLite's single writer
	// (slowly, under -race on a shared machine), so this test keeps the
	// default lease; TestProxyCrashRestart proves a 1 s lease survives a
	// request several leases long.
	base, stop := inProcessProxy(t, "--upstream", up.URL, "--store", migratedSQLite(t))
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 100}}
	defer client.CloseIdleConnections()

	original := burst(t, client, base, api, 100)
	const body = `{"sku":"x","qty":1}`
	if r := postKey(t, client, base, `"order-1"`, "Bearer B", body); r.status != http.StatusCreated || r.body == original {
		t.Fatalf("principal B: %d %s", r.status, r.body)
	}
	if r := postKey(t, client, base, `"order-2"`, "", body); r.status != http.StatusBadRequest {
		t.Fatalf("no principal: %d", r.status)
	}
	if n, k := api.calls.Load(), api.keys[0]; n != 2 || k != `"order-1"` {
		t.Fatalf("upstream calls %d, first key %q", n, k)
	}

	// Graceful stop: a request in flight completes, then the command exits 0.
	inflight := make(chan proxyResponse)
	go func() { inflight <- postKey(t, client, base, "block", "Bearer A", body) }()
	for api.calls.Load() != 3 {
		time.Sleep(5 * time.Millisecond)
	}
	stopped := make(chan struct{})
	var (
		code int
		logs string
	)
	go func() { code, logs = stop(); close(stopped) }()
	time.Sleep(300 * time.Millisecond)
	select {
	case <-stopped:
		t.Fatal("the proxy exited with a request in flight")
	default:
	}
	close(api.block)
	if r := <-inflight; r.status != http.StatusCreated {
		t.Fatalf("in-flight request during shutdown: %d %s", r.status, r.body)
	}
	<-stopped
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, logs)
	}
	for _, want := range []string{`"outcome":"processed"`, `"outcome":"duplicate"`, `"outcome":"in_progress"`, `"outcome":"mismatch"`,
		`"outcome":"rejected"`, `"key":"order-1"`, `"scope_hash":`, `"latency_ms":`, `"msg":"proxy stopped"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %s", want)
		}
	}
	if strings.Contains(logs, "Bearer") {
		t.Error("logs contain a credential")
	}
}

func TestProxyPostgres(t *testing.T) {
	t.Parallel()
	url := postgresURL(t)
	schema := testSchema(t, url)
	wantExit(t, runCLI(t, nil, "migrate", "up", "--store", url, "--schema", schema), exitOK)
	api := &orderAPI{delay: 100 * time.Millisecond}
	up := httptest.NewServer(api)
	defer up.Close()
	base, stop := inProcessProxy(t, "--upstream", up.URL, "--store", url, "--schema", schema, "--lease", "2s")
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 50}}
	defer client.CloseIdleConnections()
	burst(t, client, base, api, 50)
	if code, logs := stop(); code != exitOK {
		t.Fatalf("exit %d: %s", code, logs)
	}
}

// --scope-header scopes by the gateway's principal; --require-key rejects
// keyless POSTs.
func TestProxyScopeHeader(t *testing.T) {
	t.Parallel()
	api := &orderAPI{}
	up := httptest.NewServer(api)
	defer up.Close()
	base, _ := inProcessProxy(t, "--upstream", up.URL, "--store", migratedSQLite(t), "--scope-header", "X-Principal", "--require-key")
	client := &http.Client{}
	defer client.CloseIdleConnections()
	send := func(key, principal string) proxyResponse {
		return postHeaders(t, client, base, `{}`,
			map[string]string{"Authorization": "Bearer shared", "Idempotency-Key": key, "X-Principal": principal})
	}
	if r := send("k", ""); r.status != http.StatusBadRequest || !strings.Contains(r.body, "scope-missing") {
		t.Fatalf("no principal header: %d %s", r.status, r.body)
	}
	if r := send("", "alice"); r.status != http.StatusBadRequest || !strings.Contains(r.body, "key-missing") {
		t.Fatalf("no key: %d %s", r.status, r.body)
	}
	a, b := send("k", "alice"), send("k", "bob")
	if a.status != 201 || b.status != 201 || a.body == b.body || api.calls.Load() != 2 {
		t.Fatalf("alice %d %s, bob %d %s", a.status, a.body, b.status, b.body)
	}
	if r := send("k", "alice"); r.body != a.body || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("alice replay: %s", r.body)
	}
}

// A proxy SIGKILLed mid-request and restarted on the same store: completed
// keys replay; the in-flight key answers 409 until its lease expires, then
// the retry is forwarded again with the same Idempotency-Key.
func TestProxyCrashRestart(t *testing.T) {
	t.Parallel()
	bin := buildIdem(t)
	api := &orderAPI{block: make(chan struct{})}
	up := httptest.NewServer(api)
	defer func() { close(api.block); up.Close() }()
	dsn := migratedSQLite(t)
	client := &http.Client{}
	defer client.CloseIdleConnections()

	exited := map[*exec.Cmd]chan struct{}{}
	start := func() (*exec.Cmd, string) {
		cmd := exec.Command(bin, "proxy", "--listen", "127.0.0.1:0", "--upstream", up.URL, "--store", dsn, "--lease", "1s")
		out := &syncBuffer{}
		cmd.Stdout, cmd.Stderr = out, io.Discard
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
		exited[cmd] = done
		return cmd, waitListening(t, out, done)
	}
	p1, base := start()
	done := postKey(t, client, base, "done", "Bearer A", `{}`)
	if done.status != http.StatusCreated {
		t.Fatalf("first: %d %s", done.status, done.body)
	}
	go func() {
		// This request dies with the proxy; its error is expected.
		req, _ := http.NewRequest(http.MethodPost, base+"/orders", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "block")
		req.Header.Set("Authorization", "Bearer A")
		req.Header.Set("Content-Type", "application/json")
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	for api.calls.Load() != 2 {
		time.Sleep(5 * time.Millisecond)
	}
	// Heartbeats keep the 1 s lease alive for a request several leases long.
	time.Sleep(2500 * time.Millisecond)
	if r := postKey(t, client, base, "block", "Bearer A", `{}`); r.status != http.StatusConflict || api.calls.Load() != 2 {
		t.Fatalf("retry of a long request: %d %s, upstream calls %d", r.status, r.body, api.calls.Load())
	}
	if err := p1.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	client.CloseIdleConnections()

	p2, base := start()
	if r := postKey(t, client, base, "done", "Bearer A", `{}`); r.status != http.StatusCreated || r.body != done.body ||
		r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("completed key after restart: %d %s", r.status, r.body)
	}
	if r := postKey(t, client, base, "block", "Bearer A", `{}`); r.status != http.StatusConflict {
		t.Fatalf("in-flight key after restart: %d %s, want 409 until the lease expires", r.status, r.body)
	}
	time.Sleep(1200 * time.Millisecond)
	api.unblocked.Store(true)
	r := postKey(t, client, base, "block", "Bearer A", `{}`)
	if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry after lease expiry: %d %s", r.status, r.body)
	}
	api.mu.Lock()
	defer api.mu.Unlock()
	if len(api.keys) != 3 || api.keys[1] != "block" || api.keys[2] != "block" {
		t.Fatalf("upstream keys %q: the retry must be forwarded again with the same key", api.keys)
	}
	// SIGTERM: the real process drains and exits 0.
	client.CloseIdleConnections()
	if err := p2.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited[p2]:
	case <-time.After(20 * time.Second):
		t.Fatal("the proxy did not exit after SIGTERM")
	}
	if code := p2.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("exit code after SIGTERM: %d", code)
	}
}

// With --wait every parallel retry waits for the first and gets its response.
func TestProxyWait(t *testing.T) {
	t.Parallel()
	api := &orderAPI{delay: 200 * time.Millisecond}
	up := httptest.NewServer(api)
	defer up.Close()
	base, _ := inProcessProxy(t, "--upstream", up.URL, "--store", migratedSQLite(t), "--wait", "20s")
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 20}}
	defer client.CloseIdleConnections()
	res := make([]proxyResponse, 20)
	var wg sync.WaitGroup
	for i := range res {
		wg.Go(func() { res[i] = postKey(t, client, base, "w", "Bearer A", `{"n":1}`) })
	}
	wg.Wait()
	for _, r := range res {
		if r.status != http.StatusCreated || r.body != res[0].body {
			t.Fatalf("%d %q, want 201 %q", r.status, r.body, res[0].body)
		}
	}
	if n := api.calls.Load(); n != 1 {
		t.Fatalf("upstream calls %d", n)
	}
}
