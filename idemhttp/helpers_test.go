package idemhttp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemtest"
)

// countingStore counts calls that reach the store, to prove that rejected
// requests never touch it, and can be made to fail.
type countingStore struct {
	*idemtest.MemoryStore
	claims atomic.Int64
	fail   atomic.Bool
}

func (s *countingStore) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	s.claims.Add(1)
	if s.fail.Load() {
		return idem.Claim{}, idem.Retryable(fmt.Errorf("store down"))
	}
	return s.MemoryStore.Claim(ctx, req)
}

func newStore(opts *idemtest.MemoryOptions) *countingStore {
	return &countingStore{MemoryStore: idemtest.NewMemoryStore(opts)}
}

// newMiddleware builds a middleware over a fresh memory store; the
// principal comes from X-User unless cfg says otherwise.
func newMiddleware(t testing.TB, cfg *idemhttp.Config) (*idemhttp.Middleware, *countingStore) {
	t.Helper()
	if cfg == nil {
		cfg = &idemhttp.Config{}
	}
	cfg.AllowNonDurable = true
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Principal == nil && !cfg.SharedScope {
		cfg.Principal = idemhttp.PrincipalFromHeader("X-User")
	}
	st := newStore(nil)
	mw, err := idemhttp.New(st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return mw, st
}

// endHook adapts a function to idemhttp.RequestEndHook.
type endHook func(ctx context.Context, e idemhttp.Event)

func (f endHook) OnRequestEnd(ctx context.Context, e idemhttp.Event) { f(ctx, e) }

// payments is a payment API that is not idempotent by itself: every call
// charges again and returns a new charge ID.
type payments struct {
	charges atomic.Int64
	delay   time.Duration
}

func (p *payments) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Amount int `json:"amount"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, "bad json", http.StatusBadRequest)
		return
	}
	n := p.charges.Add(1)
	if p.delay > 0 {
		time.Sleep(p.delay)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Location", fmt.Sprintf("/charges/ch_%d", n))
	h.Set("Set-Cookie", "session=secret")
	h.Set("Authorization", "Bearer leaked")
	h.Set("WWW-Authenticate", "Basic")
	h.Set("Date", time.Now().UTC().Format(http.TimeFormat))
	h.Set("X-RateLimit-Remaining", "41")
	h.Set("X-Custom", "kept-only-if-configured")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":"ch_%d","amount":%d}`, n, req.Amount)
}

type reqOpt func(*http.Request)

func withUser(u string) reqOpt { return func(r *http.Request) { r.Header.Set("X-User", u) } }
func withHeader(k, v string) reqOpt {
	return func(r *http.Request) { r.Header.Add(k, v) }
}

// do sends a JSON POST with the key (none if key is "") as user "alice".
func do(h http.Handler, method, key, body string, opts ...reqOpt) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, "/payments", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("X-User", "alice")
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	for _, o := range opts {
		o(r)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// problemType decodes a problem+json response and returns its type.
func problemType(t testing.TB, w *httptest.ResponseRecorder) string {
	t.Helper()
	if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type = %q, want application/problem+json (status %d, body %s)", ct, w.Code, w.Body)
	}
	var p struct {
		Type   string `json:"type"`
		Status int    `json:"status"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem body %q: %v", w.Body, err)
	}
	if p.Status != w.Code {
		t.Fatalf("problem status %d, response status %d", p.Status, w.Code)
	}
	return p.Type
}

func wantProblem(t testing.TB, w *httptest.ResponseRecorder, status int, typ string) {
	t.Helper()
	if w.Code != status {
		t.Fatalf("status = %d, want %d; body %s", w.Code, status, w.Body)
	}
	if got := problemType(t, w); got != typ {
		t.Fatalf("problem type = %q, want %q", got, typ)
	}
}
