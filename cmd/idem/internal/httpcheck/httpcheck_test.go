package httpcheck

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestPointer(t *testing.T) {
	doc := []byte(`{"id": 7, "a/b": {"~x": [10, {"k": "v"}]}, "s": "str"}`)
	for p, want := range map[string]string{
		"/id": "7", "/a~1b/~0x/0": "10", "/a~1b/~0x/1": `{"k":"v"}`, "/a~1b/~0x/1/k": `"v"`, "/s": `"str"`, "": `{"id":7,"a/b":{"~x":[10,{"k":"v"}]},"s":"str"}`,
	} {
		if got, ok := pointer(doc, p); !ok || string(got) != want {
			t.Errorf("pointer(%q) = %s, %v, want %s", p, got, ok, want)
		}
	}
	for _, p := range []string{"/nope", "/a~1b/~0x/2", "/a~1b/~0x/-1", "/id/x", "/s/0"} {
		if got, ok := pointer(doc, p); ok {
			t.Errorf("pointer(%q) = %s, want nothing", p, got)
		}
	}
	if _, ok := pointer([]byte("not json"), "/id"); ok {
		t.Error("a pointer into a body that is not JSON found something")
	}
}

func TestParseHeader(t *testing.T) {
	if n, v, err := ParseHeader("  X-Test :  a: b "); err != nil || n != "X-Test" || v != "a: b" {
		t.Fatalf("ParseHeader = %q %q %v", n, v, err)
	}
	for line, want := range map[string]string{
		"NoColon": "want Name: value", "Bad Name: x": "invalid name", ": x": "invalid name",
		"X: a\r\nInjected: 1": "control character", "X: \x00": "control character",
	} {
		if _, _, err := ParseHeader(line); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseHeader(%q) = %v, want %q", line, err, want)
		}
	}
}

func TestParseBody(t *testing.T) {
	if b, err := ParseBody(`{"a":1}`); err != nil || string(b) != `{"a":1}` {
		t.Fatalf("ParseBody = %s, %v", b, err)
	}
	if _, err := ParseBody("{"); err == nil || !strings.Contains(err.Error(), "not valid JSON") {
		t.Errorf("invalid JSON: %v", err)
	}
	if _, err := ParseBody("@/nonexistent/body"); err == nil {
		t.Error("a missing file was read")
	}
	if _, err := ParseBody(strings.Repeat(" ", MaxBodyBytes+1)); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("an oversized body: %v", err)
	}
}

func TestRetryAfter(t *testing.T) {
	for v, want := range map[string]bool{"1": true, "0": true, "120": true, time.Now().Add(time.Minute).UTC().Format(http.TimeFormat): true,
		"soon": false, "-1": false, "1.5": false, "": false} {
		h := http.Header{}
		if v != "" {
			h.Set("Retry-After", v)
		}
		if _, ok := retryAfter(h); ok != want {
			t.Errorf("retryAfter(%q) ok = %v, want %v", v, ok, want)
		}
		if msg := checkRetryAfter(response{header: h}); (msg == "") != want {
			t.Errorf("checkRetryAfter(%q) = %q", v, msg)
		}
	}
}

func TestMismatchBody(t *testing.T) {
	r := &runner{}
	for body, prefix := range map[string]string{
		`{"a":1}`: `{"idem_verify_mismatch":"idem-verify-mismatch-`, ` { } `: `{"idem_verify_mismatch":"idem-verify-mismatch-`,
	} {
		r.cfg.Body = []byte(body)
		got := r.mismatchBody()
		if !strings.HasPrefix(string(got), prefix) || !strings.HasSuffix(string(got), "}") {
			t.Errorf("mismatchBody(%s) = %s", body, got)
		}
	}
	for _, body := range []string{`[1]`, `"s"`, ``, `a=1`} {
		r.cfg.Body = []byte(body)
		if got := r.mismatchBody(); got != nil {
			t.Errorf("mismatchBody(%q) = %s, want none", body, got)
		}
	}
	r.cfg.MismatchBody = []byte(`{"b":2}`)
	if got := r.mismatchBody(); string(got) != `{"b":2}` {
		t.Errorf("the configured mismatch body was not used: %s", got)
	}
}

func TestRedact(t *testing.T) {
	cfg := Config{Header: http.Header{"Authorization": {"Bearer tok-0123456789"}, "X-Api-Key": {"k-abcdefgh"}, "X-Trace": {"visible-value"}},
		PrincipalA: http.Header{"Cookie": {"sid=abc123"}}, PrincipalB: http.Header{"X-User": {"user-bob"}}}
	r := newRunner(cfg, &url.URL{Scheme: "http", Host: "127.0.0.1:1"})
	got := r.redact("Bearer tok-0123456789 and tok-0123456789 and k-abcdefgh and sid=abc123 and user-bob and visible-value")
	if strings.Contains(got, "tok-") || strings.Contains(got, "k-abcdefgh") || strings.Contains(got, "sid=abc123") || strings.Contains(got, "user-bob") ||
		!strings.Contains(got, "visible-value") {
		t.Fatalf("redact: %s", got)
	}
}

// The loopback rule is enforced where connections are made, not only
// where the name was resolved first.
func TestDialRefusesRemote(t *testing.T) {
	r := testRunner(t, Config{URL: "http://192.0.2.1:80/x", Timeout: time.Second})
	if err := r.reach(t.Context()); !errors.Is(err, errLoopbackOnly) {
		t.Fatalf("reach a remote address: %v, want errLoopbackOnly", err)
	}
	a := r.do(t.Context(), request{key: "k"})
	if !errors.Is(a.err, errLoopbackOnly) {
		t.Fatalf("request to a remote address: %v", a.err)
	}
	if err := r.cut(t.Context(), request{key: "k"}, 0); !errors.Is(err, errLoopbackOnly) {
		t.Fatalf("cut to a remote address: %v", err)
	}
	if _, err := Run(t.Context(), Config{URL: "http://localhost.invalid./x"}, nil); err == nil {
		t.Fatal("a name that does not resolve was accepted")
	}
}

// The run's budget bounds what a check sends, whatever it asks for.
func TestBudget(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusConflict) }))
	defer srv.Close()
	r := testRunner(t, Config{URL: srv.URL, Rate: MaxRate})
	r.budget.Store(5)
	for range 5 {
		if a := r.do(t.Context(), request{key: "k"}); a.err != nil {
			t.Fatal(a.err)
		}
	}
	if a := r.do(t.Context(), request{key: "k"}); !errors.Is(a.err, errBudget) {
		t.Fatalf("a request past the budget: %v", a.err)
	}
	if r.sent.Load() != 5 {
		t.Fatalf("sent %d, want 5", r.sent.Load())
	}
}

// The rate holds across goroutines: 30 requests at 100/s with bursts of 10
// take at least 0.2 s.
func TestBucket(t *testing.T) {
	b := newBucket(100, 10)
	start := time.Now()
	var wg sync.WaitGroup
	for range 30 {
		wg.Go(func() {
			if err := b.wait(t.Context()); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if took := time.Since(start); took < 190*time.Millisecond {
		t.Fatalf("30 tokens at 100/s, burst 10, in %v", took)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	for range 20 {
		if err := b.wait(ctx); err != nil {
			return
		}
	}
	t.Fatal("wait ignores a cancelled context")
}

func TestNormalize(t *testing.T) {
	c := Config{URL: "http://127.0.0.1:1/x", Body: []byte(`{}`)}
	if _, err := c.normalize(); err != nil {
		t.Fatal(err)
	}
	if c.Method != "POST" || c.KeyHeader != DefaultKeyHeader || c.MismatchStatus != 422 || c.Requests != DefaultRequests ||
		c.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("defaults: %+v", c)
	}
	for _, bad := range []Config{
		{URL: "http://127.0.0.1/x", Method: "PO ST"},
		{URL: "http://127.0.0.1/x", Header: http.Header{"Content-Length": {"1"}}},
		{URL: "http://127.0.0.1/x", CountPointer: "/n"},
		{URL: "http://127.0.0.1/x", CountURL: "nope"},
		{URL: "http://127.0.0.1/x", Timeout: -1},
		{URL: "http://127.0.0.1/x", KeyHeader: "Bad Header"},
	} {
		if _, err := bad.normalize(); !errors.Is(err, ErrConfig) {
			t.Errorf("%+v: %v, want ErrConfig", bad, err)
		}
	}
}

// testRunner is the runner of cfg once normalized.
func testRunner(t *testing.T, cfg Config) *runner {
	t.Helper()
	u, err := cfg.normalize()
	if err != nil {
		t.Fatal(err)
	}
	return newRunner(cfg, u)
}

func TestSafeURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://u:pw@127.0.0.1:8080/x?a=1":         "http://u:xxxxx@127.0.0.1:8080/x?a=1",
		"http://127.0.0.1/x?api_key=s3cret&page=2": "http://127.0.0.1/x?api_key=xxxxx&page=2",
		"http://127.0.0.1/x?access_token=s3cret":   "http://127.0.0.1/x?access_token=xxxxx",
		"http://127.0.0.1/orders":                  "http://127.0.0.1/orders",
	} {
		if got := redactURL(in); got != want {
			t.Errorf("redactURL(%q) = %q, want %q", in, got, want)
		}
	}
}
