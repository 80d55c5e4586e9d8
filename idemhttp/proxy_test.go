package idemhttp_test

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
)

// upstreamAPI is a non-idempotent service behind the proxy.
type upstreamAPI struct {
	calls atomic.Int64
	delay time.Duration
	mu    sync.Mutex
	seen  []http.Header
}

func (u *upstreamAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := u.calls.Add(1)
	u.mu.Lock()
	u.seen = append(u.seen, r.Header.Clone())
	u.mu.Unlock()
	time.Sleep(u.delay)
	b, _ := io.ReadAll(r.Body)
	w.Header().Set("Location", fmt.Sprintf("/orders/%d", n))
	w.Header().Set("Set-Cookie", "s=1")
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"order":%d,"echo":%q}`, n, b)
}

func newProxy(t *testing.T, upstream string, pcfg *idemhttp.ProxyConfig) *httptest.Server {
	t.Helper()
	mw, _ := newMiddleware(t, &idemhttp.Config{Principal: idemhttp.PrincipalFromAuthorization(), RequireKey: true})
	if pcfg == nil {
		pcfg = &idemhttp.ProxyConfig{}
	}
	pcfg.Logger = slog.New(slog.DiscardHandler)
	u, err := url.Parse(upstream)
	if err != nil {
		t.Fatal(err)
	}
	h, err := idemhttp.NewProxy(u, mw, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

func proxyPost(t *testing.T, srv *httptest.Server, key, auth, body string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(body))
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Authorization", auth)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotent-Replayed", "true") // spoofed; must not reach the upstream
	req.Header.Set("Connection", "X-Hop")
	req.Header.Set("X-Hop", "secret")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

func TestProxy(t *testing.T) {
	t.Parallel()
	api := &upstreamAPI{delay: 50 * time.Millisecond}
	up := httptest.NewServer(api)
	defer up.Close()
	srv := newProxy(t, up.URL, nil)

	type result struct {
		resp *http.Response
		body string
	}
	results := make([]result, 20)
	var wg sync.WaitGroup
	for i := range results {
		wg.Go(func() {
			r, b := proxyPost(t, srv, `"order-1"`, "Bearer A", `{"sku":"x","qty":1}`)
			results[i] = result{r, b}
		})
	}
	wg.Wait()
	if n := api.calls.Load(); n != 1 {
		t.Fatalf("upstream executions = %d, want 1", n)
	}
	var original string
	for _, r := range results {
		switch r.resp.StatusCode {
		case http.StatusCreated:
			if original == "" {
				original = r.body
			} else if r.body != original {
				t.Fatalf("body %q vs %q", r.body, original)
			}
		case http.StatusConflict:
			if r.resp.Header.Get("Retry-After") == "" {
				t.Fatal("409 without Retry-After")
			}
		default:
			t.Fatalf("status %d %s", r.resp.StatusCode, r.body)
		}
	}
	h := api.seen[0]
	if h.Get("Idempotency-Key") != `"order-1"` {
		t.Errorf("upstream got Idempotency-Key %q, want it unchanged", h.Get("Idempotency-Key"))
	}
	if h.Get("Idempotent-Replayed") != "" || h.Get("X-Hop") != "" {
		t.Errorf("upstream got spoofed or hop-by-hop headers: %v", h)
	}
	if h.Get("X-Forwarded-For") == "" {
		t.Error("no X-Forwarded-For")
	}
	// Retries replay; the key reordered JSON replays; another body is 422.
	resp, body := proxyPost(t, srv, `"order-1"`, "Bearer A", `{ "qty":1, "sku":"x" }`)
	if resp.StatusCode != http.StatusCreated || body != original || resp.Header.Get("Idempotent-Replayed") != "true" ||
		resp.Header.Get("Location") != "/orders/1" || resp.Header.Get("Set-Cookie") != "" {
		t.Fatalf("replay: %d %q %v", resp.StatusCode, body, resp.Header)
	}
	if resp, _ := proxyPost(t, srv, `"order-1"`, "Bearer A", `{"sku":"y","qty":1}`); resp.StatusCode != http.StatusUnprocessableEntity {
		t.Fatalf("different body: %d", resp.StatusCode)
	}
	// Another principal with the same key gets its own execution.
	if resp, body := proxyPost(t, srv, `"order-1"`, "Bearer B", `{"sku":"x","qty":1}`); resp.StatusCode != 201 || body == original {
		t.Fatalf("principal B: %d %s", resp.StatusCode, body)
	}
	// Neither scope header nor Authorization → 400.
	if resp, _ := proxyPost(t, srv, `"order-2"`, "", `{}`); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("no principal: %d", resp.StatusCode)
	}
	if n := api.calls.Load(); n != 2 {
		t.Fatalf("upstream executions = %d, want 2", n)
	}
}

// flakyTransport fails the first n round trips as an unreachable upstream would.
type flakyTransport struct {
	fails atomic.Int64
	next  http.RoundTripper
}

func (f *flakyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if f.fails.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	}
	return f.next.RoundTrip(r)
}

func TestProxyUpstreamUnreachableReleases(t *testing.T) {
	t.Parallel()
	api := &upstreamAPI{}
	up := httptest.NewServer(api)
	defer up.Close()
	ft := &flakyTransport{next: up.Client().Transport}
	ft.fails.Store(1)
	srv := newProxy(t, up.URL, &idemhttp.ProxyConfig{Transport: ft})
	resp, body := proxyPost(t, srv, "k", "Bearer A", `{}`)
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, idemhttp.TypeUpstreamUnreachable) ||
		resp.Header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	resp, _ = proxyPost(t, srv, "k", "Bearer A", `{}`)
	if resp.StatusCode != http.StatusCreated || resp.Header.Get("Idempotent-Replayed") != "" || api.calls.Load() != 1 {
		t.Fatalf("retry after 502: %d, upstream calls %d", resp.StatusCode, api.calls.Load())
	}

	// A closed upstream port: 502 as well.
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()
	srv2 := newProxy(t, "http://"+addr, nil)
	if resp, _ := proxyPost(t, srv2, "k", "Bearer A", `{}`); resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("closed port: %d", resp.StatusCode)
	}
}

// An upstream that got the request and did not answer in time may have
// executed it: the outcome-unknown answer is recorded and replayed, and the
// retry is not forwarded (InDoubtRecord, the default).
func TestProxyUpstreamTimeoutIsInDoubt(t *testing.T) {
	t.Parallel()
	api := &upstreamAPI{delay: 500 * time.Millisecond}
	up := httptest.NewServer(api)
	defer up.Close()
	srv := newProxy(t, up.URL, &idemhttp.ProxyConfig{Timeout: 50 * time.Millisecond})
	resp, body := proxyPost(t, srv, "k", "Bearer A", `{}`)
	if resp.StatusCode != http.StatusGatewayTimeout || !strings.Contains(body, idemhttp.TypeOutcomeUnknown) ||
		resp.Header.Get("Idempotency-Key") != "k" {
		t.Fatalf("%d %s %v", resp.StatusCode, body, resp.Header)
	}
	for range 3 {
		r, b := proxyPost(t, srv, "k", "Bearer A", `{}`)
		if r.StatusCode != http.StatusGatewayTimeout || b != body || r.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("retry: %d %s", r.StatusCode, b)
		}
	}
	if n := api.calls.Load(); n != 1 {
		t.Fatalf("upstream calls %d, want 1: an in-doubt request must not be forwarded again", n)
	}

	// InDoubtRelease: at-least-once, the retry is forwarded again.
	api2 := &upstreamAPI{delay: 500 * time.Millisecond}
	up2 := httptest.NewServer(api2)
	defer up2.Close()
	srv2 := newProxy(t, up2.URL, &idemhttp.ProxyConfig{Timeout: 50 * time.Millisecond, InDoubt: idemhttp.InDoubtRelease})
	for range 2 {
		if r, b := proxyPost(t, srv2, "k", "Bearer A", `{}`); r.StatusCode != http.StatusGatewayTimeout ||
			!strings.Contains(b, "released") || r.Header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("release: %d %s", r.StatusCode, b)
		}
	}
	if n := api2.calls.Load(); n != 2 {
		t.Fatalf("upstream calls %d with InDoubtRelease, want 2", n)
	}
}

func TestNewProxyErrors(t *testing.T) {
	t.Parallel()
	mw, _ := newMiddleware(t, nil)
	if _, err := idemhttp.NewProxy(&url.URL{Path: "/x"}, mw, nil); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatal(err)
	}
	if _, err := idemhttp.NewProxy(&url.URL{Scheme: "http", Host: "x"}, nil, nil); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatal(err)
	}
}

// TestProxyKeepsUpstreamConnections sends two rounds of 16 concurrent
// requests (each round held at the upstream until all 16 arrived): the
// second round must reuse the first round's connections. With net/http's
// default of 2 idle connections per host it opened 14 new ones.
func TestProxyKeepsUpstreamConnections(t *testing.T) {
	t.Parallel()
	const n = 16
	var (
		mu      sync.Mutex
		opened  int
		arrived = make(chan struct{}, n)
		release = make(chan struct{})
	)
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
		w.WriteHeader(http.StatusCreated)
	}))
	up.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			mu.Lock()
			opened++
			mu.Unlock()
		}
	}
	up.Start()
	t.Cleanup(up.Close)
	srv := newProxy(t, up.URL, nil)
	for round := range 2 {
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				resp, _ := proxyPost(t, srv, fmt.Sprintf("conn-%d-%d", round, i), "Bearer a", "{}")
				if resp.StatusCode != http.StatusCreated {
					t.Errorf("status %d", resp.StatusCode)
				}
			})
		}
		for range n {
			<-arrived
		}
		for range n {
			release <- struct{}{}
		}
		wg.Wait()
	}
	mu.Lock()
	defer mu.Unlock()
	if opened > n+2 { // a request may start before the last one's connection is back
		t.Errorf("the proxy opened %d connections to the upstream for 2 rounds of %d concurrent requests; want about %d", opened, n, n)
	}
}
