package idemhttp_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/idemhttp"
)

// cached builds a middleware with a replay cache over a counting memory
// store, around a fresh payments handler.
func cached(t *testing.T, cache idemhttp.ReplayCache, cfg *idemhttp.Config) (http.Handler, *countingStore, *payments) {
	t.Helper()
	if cfg == nil {
		cfg = &idemhttp.Config{}
	}
	cfg.Cache = &cache
	mw, st := newMiddleware(t, cfg)
	p := &payments{}
	return mw.Handler(p), st, p
}

func TestCacheReplaysWithoutTheStore(t *testing.T) {
	t.Parallel()
	h, st, p := cached(t, idemhttp.ReplayCache{MaxAge: time.Minute}, nil)
	first := do(h, http.MethodPost, "k1", `{"amount":5}`)
	if first.Code != http.StatusCreated {
		t.Fatalf("first: %d %s", first.Code, first.Body)
	}
	claims := st.claims.Load()
	var wg sync.WaitGroup
	for range 48 {
		wg.Go(func() {
			w := do(h, http.MethodPost, "k1", `{ "amount": 5 }`) // same JSON, other spacing
			if w.Code != http.StatusCreated || w.Body.String() != first.Body.String() ||
				w.Header().Get(idemhttp.ReplayedHeader) != "true" || w.Header().Get("Location") != first.Header().Get("Location") ||
				w.Header().Get("Set-Cookie") != "" || w.Header().Get("Idempotency-Key") != "k1" {
				t.Errorf("replay: %d %v %s", w.Code, w.Header(), w.Body)
			}
		})
	}
	wg.Wait()
	wantCounts(t, "replays", st.claims.Load()-claims, 0, p.charges.Load(), 1)
}

func TestCacheFillsFromStoreReplays(t *testing.T) {
	t.Parallel()
	// Two instances over one store: the second learns the response from
	// its first replay and serves the rest itself.
	st := newStore(nil)
	cfg := func() *idemhttp.Config {
		return &idemhttp.Config{AllowNonDurable: true, Principal: idemhttp.PrincipalFromHeader("X-User"), Cache: &idemhttp.ReplayCache{}}
	}
	a, err := idemhttp.New(st, cfg())
	if err != nil {
		t.Fatal(err)
	}
	b, err := idemhttp.New(st, cfg())
	if err != nil {
		t.Fatal(err)
	}
	p := &payments{}
	first := do(a.Handler(p), http.MethodPost, "k", `{"amount":5}`)
	claims := st.claims.Load()
	for range 10 {
		w := do(b.Handler(p), http.MethodPost, "k", `{"amount":5}`)
		if w.Code != first.Code || w.Body.String() != first.Body.String() {
			t.Fatalf("replay on the second instance: %d %s", w.Code, w.Body)
		}
	}
	if got := st.claims.Load() - claims; got != 1 {
		t.Errorf("%d of the second instance's replays reached the store, want 1", got)
	}
}

func TestCacheNeverServesAnotherPrincipal(t *testing.T) {
	t.Parallel()
	h, _, p := cached(t, idemhttp.ReplayCache{MaxAge: time.Minute}, nil)
	const users = 32
	bodies := make([]string, users)
	var wg sync.WaitGroup
	for u := range users {
		wg.Go(func() {
			w := do(h, http.MethodPost, "shared-key", `{"amount":1}`, withUser(fmt.Sprint("user", u)))
			if w.Code != http.StatusCreated {
				t.Errorf("user %d: %d %s", u, w.Code, w.Body)
			}
			bodies[u] = w.Body.String()
		})
	}
	wg.Wait()
	if n := p.charges.Load(); n != users {
		t.Fatalf("%d charges for %d principals, want one each", n, users)
	}
	for round := range 3 {
		for u := range users {
			wg.Go(func() {
				w := do(h, http.MethodPost, "shared-key", `{"amount":1}`, withUser(fmt.Sprint("user", u)))
				if w.Body.String() != bodies[u] || w.Header().Get(idemhttp.ReplayedHeader) != "true" {
					t.Errorf("round %d, user %d got %q, want its own %q", round, u, w.Body, bodies[u])
				}
			})
		}
		wg.Wait()
	}
}

func TestCacheNeverHoldsInProgressOrMismatch(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	entered := make(chan struct{})
	var once sync.Once
	cfg := &idemhttp.Config{AllowNonDurable: true, Principal: idemhttp.PrincipalFromHeader("X-User"), Cache: &idemhttp.ReplayCache{MaxAge: time.Minute}}
	st := newStore(nil)
	mw, err := idemhttp.New(st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := &payments{}
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		once.Do(func() { close(entered) })
		<-release
		p.ServeHTTP(w, r)
	}))
	done := make(chan string)
	go func() { done <- do(h, http.MethodPost, "k", `{"amount":1}`).Body.String() }()
	<-entered
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Go(func() {
			if i%2 == 0 {
				wantProblem(t, do(h, http.MethodPost, "k", `{"amount":1}`), http.StatusConflict, idemhttp.TypeKeyInFlight)
			} else {
				wantProblem(t, do(h, http.MethodPost, "k", `{"amount":2}`), http.StatusUnprocessableEntity, idemhttp.TypeKeyReused)
			}
		})
	}
	wg.Wait()
	close(release)
	first := <-done
	claims := st.claims.Load()
	for i := range 32 {
		wg.Go(func() {
			if i%2 == 0 {
				if w := do(h, http.MethodPost, "k", `{"amount":1}`); w.Body.String() != first {
					t.Errorf("replay %q, want %q", w.Body, first)
				}
			} else {
				// A different payload never gets the cached response: it
				// goes to the store, which says 422.
				wantProblem(t, do(h, http.MethodPost, "k", `{"amount":2}`), http.StatusUnprocessableEntity, idemhttp.TypeKeyReused)
			}
		})
	}
	wg.Wait()
	wantCounts(t, "after completion (the 16 mismatches)", st.claims.Load()-claims, 16, p.charges.Load(), 1)
}

func TestCacheNeverHoldsTombstones(t *testing.T) {
	t.Parallel()
	h, st, p := cached(t, idemhttp.ReplayCache{MaxAge: time.Minute}, &idemhttp.Config{MaxResponseBytes: 4})
	if w := do(h, http.MethodPost, "k", `{"amount":1}`); w.Code != http.StatusCreated {
		t.Fatalf("first: %d", w.Code)
	}
	claims := st.claims.Load()
	for range 5 {
		wantProblem(t, do(h, http.MethodPost, "k", `{"amount":1}`), http.StatusGone, idemhttp.TypeResultDiscarded)
	}
	wantCounts(t, "retries of a tombstone", st.claims.Load()-claims, 5, p.charges.Load(), 1)
}

func TestCacheDeleteSeenWithinMaxAge(t *testing.T) {
	t.Parallel()
	const maxAge = 200 * time.Millisecond
	h, st, p := cached(t, idemhttp.ReplayCache{MaxAge: maxAge}, nil)
	first := do(h, http.MethodPost, "k", `{"amount":1}`)
	deleted := time.Now()
	if err := st.Delete(context.Background(), idemhttp.Scope("alice", "POST", "/payments"), "k"); err != nil {
		t.Fatal(err)
	}
	// Within MaxAge the cache may still replay; after it, never.
	time.Sleep(time.Until(deleted.Add(maxAge)))
	w := do(h, http.MethodPost, "k", `{"amount":1}`)
	if w.Code != http.StatusCreated || w.Header().Get(idemhttp.ReplayedHeader) == "true" || w.Body.String() == first.Body.String() {
		t.Fatalf("after the delete and MaxAge: %d %v %s, want a new execution", w.Code, w.Header(), w.Body)
	}
	if n := p.charges.Load(); n != 2 {
		t.Fatalf("%d charges, want 2 (the delete let the key run again)", n)
	}
}

func TestCacheHonoursRetention(t *testing.T) {
	t.Parallel()
	// A record kept for less than MaxAge is not replayed past its expiry.
	retention := 300 * time.Millisecond
	h, _, p := cached(t, idemhttp.ReplayCache{MaxAge: time.Minute}, &idemhttp.Config{Retention: retention})
	do(h, http.MethodPost, "k", `{"amount":1}`)
	recorded := time.Now() // the record expires before recorded+retention
	time.Sleep(time.Until(recorded.Add(retention)))
	if w := do(h, http.MethodPost, "k", `{"amount":1}`); w.Header().Get(idemhttp.ReplayedHeader) == "true" {
		t.Fatalf("replayed %s after the record's retention", w.Body)
	}
	if n := p.charges.Load(); n != 2 {
		t.Fatalf("%d charges, want 2", n)
	}
}

func TestCacheConfigErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []idemhttp.ReplayCache{{MaxEntries: -1}, {MaxBytes: -5}, {MaxAge: time.Hour}} {
		_, err := idemhttp.New(newStore(nil), &idemhttp.Config{AllowNonDurable: true, SharedScope: true, Cache: &c})
		if err == nil || !strings.Contains(err.Error(), "ReplayCache") {
			t.Errorf("%+v: %v", c, err)
		}
	}
}

// TestCacheRawRetry: a retry byte for byte like the request that filled
// the cache is answered from it before its body is decoded; anything that
// changes the fingerprint still goes to the store and gets 422, and keys
// stay scoped to the principal.
func TestCacheRawRetry(t *testing.T) {
	t.Parallel()
	h, st, p := cached(t, idemhttp.ReplayCache{MaxAge: time.Minute}, &idemhttp.Config{SignificantHeaders: []string{"Accept"}})
	accept := withHeader("Accept", "application/json")
	first := do(h, http.MethodPost, "k1", `{"amount":5}`, accept)
	if first.Code != http.StatusCreated {
		t.Fatalf("first: %d %s", first.Code, first.Body)
	}
	claims := st.claims.Load()
	w := do(h, http.MethodPost, "k1", `{"amount":5}`, accept)
	if w.Code != http.StatusCreated || w.Body.String() != first.Body.String() || w.Header().Get(idemhttp.ReplayedHeader) != "true" ||
		w.Header().Get("Idempotency-Key") != "k1" || w.Header().Get("Set-Cookie") != "" || w.Header().Get("Authorization") != "" ||
		w.Header().Get("Content-Length") != strconv.Itoa(first.Body.Len()) {
		t.Fatalf("identical retry: %d %v %s", w.Code, w.Header(), w.Body)
	}
	if got := st.claims.Load() - claims; got != 0 {
		t.Errorf("identical retry reached the store %d times", got)
	}
	mismatches := map[string]*httptest.ResponseRecorder{
		"other payload":      do(h, http.MethodPost, "k1", `{"amount":6}`, accept),
		"other Accept":       do(h, http.MethodPost, "k1", `{"amount":5}`, withHeader("Accept", "text/csv")),
		"no Accept":          do(h, http.MethodPost, "k1", `{"amount":5}`),
		"other Content-Type": do(h, http.MethodPost, "k1", `{"amount":5}`, accept, func(r *http.Request) { r.Header.Set("Content-Type", "text/plain") }),
		"other URI": do(h, http.MethodPost, "k1", `{"amount":5}`, accept, func(r *http.Request) {
			r.URL.RawQuery = "dry_run=1"
		}),
	}
	for name, w := range mismatches {
		if w.Code != http.StatusUnprocessableEntity || w.Header().Get("Idempotency-Key") != "k1" {
			t.Errorf("%s: %d %v %s, want 422", name, w.Code, w.Header(), w.Body)
		}
	}
	// Bob's byte-identical request is his own: it runs.
	if w := do(h, http.MethodPost, "k1", `{"amount":5}`, accept, withUser("bob")); w.Code != http.StatusCreated ||
		w.Header().Get(idemhttp.ReplayedHeader) != "" {
		t.Errorf("bob: %d %v, want a first execution", w.Code, w.Header())
	}
	// Errors found reading or decoding the body still come out, with the
	// key echoed, and touch neither the cache nor the store.
	claims = st.claims.Load()
	if w := do(h, http.MethodPost, "k2", `{"amount":`, accept); w.Code != http.StatusBadRequest || w.Header().Get("Idempotency-Key") != "k2" {
		t.Errorf("invalid JSON: %d %v", w.Code, w.Header())
	}
	big := `{"pad":"` + strings.Repeat("x", idemhttp.DefaultMaxBodyBytes) + `"}`
	if w := do(h, http.MethodPost, "k3", big, accept); w.Code != http.StatusRequestEntityTooLarge || w.Header().Get("Idempotency-Key") != "k3" {
		t.Errorf("large body: %d %v", w.Code, w.Header())
	}
	wantCounts(t, "rejected requests", st.claims.Load()-claims, 0, p.charges.Load(), 2)
}

// TestCacheRawRetryGzip: a compressed body is compared as sent, and its
// decoded form still replays the same key.
func TestCacheRawRetryGzip(t *testing.T) {
	t.Parallel()
	// The handler gets the body as sent, compressed: it does not parse it.
	var charges atomic.Int64
	mw, st := newMiddleware(t, &idemhttp.Config{Cache: &idemhttp.ReplayCache{MaxAge: time.Minute}})
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"charge":%d}`, charges.Add(1))
	}))
	gz := func(s string) string {
		var b bytes.Buffer
		zw := gzip.NewWriter(&b)
		_, _ = zw.Write([]byte(s))
		_ = zw.Close()
		return b.String()
	}
	enc := withHeader("Content-Encoding", "gzip")
	if w := do(h, http.MethodPost, "g", gz(`{"amount":7}`), enc); w.Code != http.StatusCreated {
		t.Fatalf("first: %d %s", w.Code, w.Body)
	}
	claims := st.claims.Load()
	for name, w := range map[string]*httptest.ResponseRecorder{
		"same bytes":   do(h, http.MethodPost, "g", gz(`{"amount":7}`), enc),
		"decoded":      do(h, http.MethodPost, "g", `{"amount":7}`),
		"respaced gz":  do(h, http.MethodPost, "g", gz(`{ "amount" : 7 }`), enc),
		"other amount": do(h, http.MethodPost, "g", gz(`{"amount":8}`), enc),
	} {
		want := http.StatusCreated
		if name == "other amount" {
			want = http.StatusUnprocessableEntity
		}
		if w.Code != want || (want == http.StatusCreated && w.Header().Get(idemhttp.ReplayedHeader) != "true") {
			t.Errorf("%s: %d %v, want %d", name, w.Code, w.Header(), want)
		}
	}
	wantCounts(t, "retries (the mismatch)", st.claims.Load()-claims, 1, charges.Load(), 1)
}

// TestCacheRawRetryConcurrent: dozens of clients, each with its own key
// and body, retry and mismatch at once; the pooled body buffers of the
// replays never leak into another request's body, response or record.
func TestCacheRawRetryConcurrent(t *testing.T) {
	t.Parallel()
	echo := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(b)
	})
	mw, _ := newMiddleware(t, &idemhttp.Config{Cache: &idemhttp.ReplayCache{MaxAge: time.Minute}})
	h := mw.Handler(echo)
	var wg sync.WaitGroup
	for g := range 48 {
		wg.Go(func() {
			key := fmt.Sprintf("key-%d", g)
			body := fmt.Sprintf(`{"client":%d,"pad":"%s"}`, g, strings.Repeat(strconv.Itoa(g%10), 100+g*40))
			for i := range 30 {
				send, want := body, http.StatusCreated
				if i%3 == 2 {
					send, want = fmt.Sprintf(`{"client":%d,"other":%d}`, g, i), http.StatusUnprocessableEntity
				}
				w := do(h, http.MethodPost, key, send)
				if w.Code != want || (want == http.StatusCreated && w.Body.String() != body) {
					t.Errorf("client %d request %d: %d %q, want %d with its own body", g, i, w.Code, w.Body, want)
					return
				}
				if i > 0 && want == http.StatusCreated && w.Header().Get(idemhttp.ReplayedHeader) != "true" {
					t.Errorf("client %d request %d: not a replay", g, i)
				}
			}
		})
	}
	wg.Wait()
}

// wantCounts checks how many claims of the requests that what names
// reached the store, and how many charges were made.
func wantCounts(t *testing.T, what string, claims, wantClaims, charges, wantCharges int64) {
	t.Helper()
	if claims != wantClaims {
		t.Errorf("%s: %d claims reached the store, want %d", what, claims, wantClaims)
	}
	if charges != wantCharges {
		t.Errorf("%d charges, want %d", charges, wantCharges)
	}
}
