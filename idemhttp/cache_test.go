package idemhttp_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
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
	if got := st.claims.Load() - claims; got != 0 {
		t.Errorf("%d replays reached the store, want 0", got)
	}
	if n := p.charges.Load(); n != 1 {
		t.Errorf("%d charges, want 1", n)
	}
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
	if got := st.claims.Load() - claims; got != 16 {
		t.Errorf("%d requests reached the store after completion, want the 16 mismatches", got)
	}
	if n := p.charges.Load(); n != 1 {
		t.Errorf("%d charges, want 1", n)
	}
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
	if got := st.claims.Load() - claims; got != 5 {
		t.Errorf("%d of 5 retries of a tombstone reached the store", got)
	}
	if n := p.charges.Load(); n != 1 {
		t.Errorf("%d charges, want 1", n)
	}
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
