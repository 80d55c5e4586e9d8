package idemhttp_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemtest"
)

const body1 = `{"amount":100}`

// parallel sends n identical requests at once and returns the responses.
func parallel(h http.Handler, n int, key, body string) []*httptest.ResponseRecorder {
	out := make([]*httptest.ResponseRecorder, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			out[i] = do(h, http.MethodPost, key, body)
		})
	}
	close(start)
	wg.Wait()
	return out
}

// Acceptance 1: 100 parallel requests with one key → exactly one charge.
func TestParallelSameKeyOneCharge(t *testing.T) {
	t.Parallel()
	p := &payments{delay: 50 * time.Millisecond}
	mw, _ := newMiddleware(t, nil)
	h := mw.Handler(p)

	res := parallel(h, 100, "pay-1", body1)
	if n := p.charges.Load(); n != 1 {
		t.Fatalf("charges = %d, want 1", n)
	}
	var original string
	fresh, replayed, inflight := 0, 0, 0
	for _, w := range res {
		switch w.Code {
		case http.StatusCreated:
			if original == "" {
				original = w.Body.String()
			}
			if w.Body.String() != original {
				t.Fatalf("body %q differs from %q", w.Body, original)
			}
			if w.Header().Get("Idempotent-Replayed") == "true" {
				replayed++
			} else {
				fresh++
			}
		case http.StatusConflict:
			wantProblem(t, w, http.StatusConflict, idemhttp.TypeKeyInFlight)
			if w.Header().Get("Retry-After") == "" {
				t.Fatal("409 without Retry-After")
			}
			inflight++
		default:
			t.Fatalf("unexpected status %d: %s", w.Code, w.Body)
		}
	}
	if fresh != 1 || fresh+replayed+inflight != 100 {
		t.Fatalf("fresh=%d replayed=%d inflight=%d", fresh, replayed, inflight)
	}
	// Every later retry replays the original.
	w := do(h, http.MethodPost, "pay-1", body1)
	if w.Code != http.StatusCreated || w.Body.String() != original || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d %q %v", w.Code, w.Body, w.Header())
	}
	if w.Header().Get("Location") != "/charges/ch_1" {
		t.Fatalf("Location = %q", w.Header().Get("Location"))
	}

	// Wait mode: every request gets the original response.
	p2 := &payments{delay: 100 * time.Millisecond}
	mw2, _ := newMiddleware(t, &idemhttp.Config{Wait: 10 * time.Second})
	res = parallel(mw2.Handler(p2), 100, "pay-2", body1)
	if n := p2.charges.Load(); n != 1 {
		t.Fatalf("wait mode: charges = %d, want 1", n)
	}
	for _, w := range res {
		if w.Code != http.StatusCreated || w.Body.String() != res[0].Body.String() {
			t.Fatalf("wait mode: %d %q, want 201 %q", w.Code, w.Body, res[0].Body)
		}
	}
}

// Acceptance 2: same key, different body → 422, the record untouched; the
// same JSON reordered and re-spaced replays.
func TestFingerprintMismatch(t *testing.T) {
	t.Parallel()
	p := &payments{}
	mw, st := newMiddleware(t, nil)
	h := mw.Handler(p)
	first := do(h, http.MethodPost, "k", `{"amount":100,"currency":"eur"}`)
	if first.Code != http.StatusCreated {
		t.Fatal(first.Code, first.Body)
	}
	// The scope is internal, so the record is checked through replays.
	replays := func() {
		t.Helper()
		w := do(h, http.MethodPost, "k", "{ \"currency\" : \"eur\",\n \"amount\":100 }")
		if w.Code != http.StatusCreated || w.Body.String() != first.Body.String() || w.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("reordered JSON did not replay: %d %s", w.Code, w.Body)
		}
	}
	replays()
	before := st.claims.Load()
	w := do(h, http.MethodPost, "k", `{"amount":999,"currency":"eur"}`)
	wantProblem(t, w, http.StatusUnprocessableEntity, idemhttp.TypeKeyReused)
	if st.claims.Load() != before+1 || p.charges.Load() != 1 {
		t.Fatalf("charges = %d", p.charges.Load())
	}
	replays() // still replays the original: the record is untouched
	// The same route with another query string is a mismatch too.
	r := httptest.NewRequest(http.MethodPost, "/payments?x=1", strings.NewReader(`{"amount":100,"currency":"eur"}`))
	r.Header.Set("X-User", "alice")
	r.Header.Set("Idempotency-Key", "k")
	r.Header.Set("Content-Type", "application/json")
	w = httptest.NewRecorder()
	mw.Handler(p).ServeHTTP(w, r)
	wantProblem(t, w, http.StatusUnprocessableEntity, idemhttp.TypeKeyReused)
	if p.charges.Load() != 1 {
		t.Fatalf("charges = %d", p.charges.Load())
	}
}

// Acceptance 3: missing key → 400 when required; other methods pass through.
func TestMissingKeyAndMethods(t *testing.T) {
	t.Parallel()
	p := &payments{}
	mw, st := newMiddleware(t, &idemhttp.Config{RequireKey: true})
	h := mw.Handler(p)
	wantProblem(t, do(h, http.MethodPost, "", body1), http.StatusBadRequest, idemhttp.TypeKeyMissing)
	if w := do(h, http.MethodPut, "", body1); w.Code != http.StatusCreated {
		t.Fatalf("PUT: %d", w.Code)
	}
	if w := do(h, http.MethodPut, "k", body1); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("PUT with key: %d", w.Code)
	}
	if st.claims.Load() != 0 {
		t.Fatalf("store touched %d times", st.claims.Load())
	}
	// Optional keys: a keyless POST passes through and runs every time.
	mw2, _ := newMiddleware(t, nil)
	h2 := mw2.Handler(p)
	do(h2, http.MethodPost, "", body1)
	do(h2, http.MethodPost, "", body1)
	if n := p.charges.Load(); n != 4 {
		t.Fatalf("charges = %d, want 4", n)
	}
}

// Acceptance 4: key header parsing and validation.
func TestKeyHeader(t *testing.T) {
	t.Parallel()
	p := &payments{}
	mw, st := newMiddleware(t, nil)
	h := mw.Handler(p)
	w := do(h, http.MethodPost, "a", body1, withHeader("Idempotency-Key", "b"))
	wantProblem(t, w, http.StatusBadRequest, idemhttp.TypeKeyInvalid)
	for _, bad := range []string{`"a", "b"`, "\"caf\xc3\xa9\"", "caf\xc3\xa9", strings.Repeat("k", 256), `"` + strings.Repeat("k", 256) + `"`, `""`, `"abc`, "a b"} {
		wantProblem(t, do(h, http.MethodPost, bad, body1), http.StatusBadRequest, idemhttp.TypeKeyInvalid)
	}
	if st.claims.Load() != 0 {
		t.Fatalf("invalid keys touched the store %d times", st.claims.Load())
	}
	first := do(h, http.MethodPost, `"abc"`, body1)
	if first.Code != http.StatusCreated {
		t.Fatal(first.Code)
	}
	// The bare token is the same key.
	w = do(h, http.MethodPost, "abc", body1)
	if w.Header().Get("Idempotent-Replayed") != "true" || w.Body.String() != first.Body.String() {
		t.Fatalf("bare token did not replay: %d %s", w.Code, w.Body)
	}
	if w := do(h, http.MethodPost, strings.Repeat("k", 255), body1); w.Code != http.StatusCreated {
		t.Fatalf("255-byte key: %d", w.Code)
	}
}

// Acceptance 5: body over the limit → 413, nothing claimed; invalid JSON → 400.
func TestBodyLimits(t *testing.T) {
	t.Parallel()
	p := &payments{}
	mw, st := newMiddleware(t, &idemhttp.Config{MaxBodyBytes: 32})
	h := mw.Handler(p)
	wantProblem(t, do(h, http.MethodPost, "k", `{"amount":1,"pad":"`+strings.Repeat("x", 64)+`"}`),
		http.StatusRequestEntityTooLarge, idemhttp.TypeBodyTooLarge)
	wantProblem(t, do(h, http.MethodPost, "k", `{"amount":`), http.StatusBadRequest, idemhttp.TypeBodyInvalid)
	if st.claims.Load() != 0 || p.charges.Load() != 0 {
		t.Fatalf("claims=%d charges=%d", st.claims.Load(), p.charges.Load())
	}
	// The key is still free.
	if w := do(h, http.MethodPost, "k", body1); w.Code != http.StatusCreated {
		t.Fatal(w.Code, w.Body)
	}
}

// Acceptance 6: credentials and per-response headers are never stored.
func TestHeadersNeverStored(t *testing.T) {
	t.Parallel()
	p := &payments{}
	mw, _ := newMiddleware(t, &idemhttp.Config{ReplayHeaders: []string{"X-Custom"}})
	h := mw.Handler(p)
	first := do(h, http.MethodPost, "k", body1)
	if first.Header().Get("Set-Cookie") == "" {
		t.Fatal("the first caller must get the handler's own headers")
	}
	w := do(h, http.MethodPost, "k", body1)
	for _, name := range []string{"Set-Cookie", "Authorization", "WWW-Authenticate", "Date", "X-RateLimit-Remaining"} {
		if v := w.Header().Get(name); v != "" {
			t.Errorf("replay carries %s: %q", name, v)
		}
	}
	for name, want := range map[string]string{"Content-Type": "application/json", "Location": "/charges/ch_1", "X-Custom": "kept-only-if-configured"} {
		if v := w.Header().Get(name); v != want {
			t.Errorf("replay %s = %q, want %q", name, v, want)
		}
	}
	for _, bad := range []string{"Set-Cookie", "date", "Authorization", "RateLimit-Remaining", "Idempotent-Replayed"} {
		_, err := idemhttp.New(idemtest.NewMemoryStore(nil), &idemhttp.Config{AllowNonDurable: true, ReplayHeaders: []string{bad}})
		if !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("ReplayHeaders %q: err = %v", bad, err)
		}
	}
}

// Acceptance 7: principals never see each other's responses.
func TestPrincipalIsolation(t *testing.T) {
	t.Parallel()
	p := &payments{}
	mw, _ := newMiddleware(t, nil)
	h := mw.Handler(p)
	a := do(h, http.MethodPost, "k", body1, withUser("A"))
	b := do(h, http.MethodPost, "k", body1, withUser("B"))
	if a.Code != http.StatusCreated || b.Code != http.StatusCreated || b.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("A %d, B %d %v", a.Code, b.Code, b.Header())
	}
	if a.Body.String() == b.Body.String() || p.charges.Load() != 2 {
		t.Fatalf("B got A's response: %s / %s", a.Body, b.Body)
	}
	if ra := do(h, http.MethodPost, "k", body1, withUser("A")); ra.Body.String() != a.Body.String() {
		t.Fatalf("A replay %s", ra.Body)
	}
	if rb := do(h, http.MethodPost, "k", body1, withUser("B")); rb.Body.String() != b.Body.String() {
		t.Fatalf("B replay %s", rb.Body)
	}
	// No principal → 400, never one anonymous bucket.
	wantProblem(t, do(h, http.MethodPost, "k", body1, withUser("")), http.StatusBadRequest, idemhttp.TypeScopeMissing)
}

func TestScopeRequired(t *testing.T) {
	t.Parallel()
	p := &payments{}
	st := idemtest.NewMemoryStore(nil)
	mw, err := idemhttp.New(st, &idemhttp.Config{AllowNonDurable: true})
	if err != nil {
		t.Fatal(err)
	}
	wantProblem(t, do(mw.Handler(p), http.MethodPost, "k", body1), http.StatusBadRequest, idemhttp.TypeScopeMissing)
	mw, _ = idemhttp.New(st, &idemhttp.Config{AllowNonDurable: true, Principal: func(*http.Request) (string, error) {
		return "", errors.New("token expired")
	}})
	wantProblem(t, do(mw.Handler(p), http.MethodPost, "k", body1), http.StatusBadRequest, idemhttp.TypeScopeMissing)
	mw, _ = idemhttp.New(st, &idemhttp.Config{AllowNonDurable: true, SharedScope: true})
	h := mw.Handler(p)
	do(h, http.MethodPost, "k", body1, withUser("A"))
	if w := do(h, http.MethodPost, "k", body1, withUser("B")); w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatal("shared scope did not share")
	}
	if p.charges.Load() != 1 {
		t.Fatalf("charges = %d", p.charges.Load())
	}
}

func TestNonDurableRefused(t *testing.T) {
	t.Parallel()
	if _, err := idemhttp.New(idemtest.NewMemoryStore(nil), nil); !errors.Is(err, idem.ErrNotDurable) {
		t.Fatalf("err = %v, want ErrNotDurable", err)
	}
	if _, err := idemhttp.New(nil, nil); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("nil store: err = %v", err)
	}
}

// statusHandler answers with the statuses in order, then 201.
func statusHandler(calls *int, statuses ...int) http.Handler {
	var mu sync.Mutex
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		i := *calls
		*calls++
		mu.Unlock()
		code := http.StatusCreated
		if i < len(statuses) {
			code = statuses[i]
		}
		w.WriteHeader(code)
		io.WriteString(w, http.StatusText(code))
	})
}

// Acceptance 8: 5xx and "try again" 4xx release the key; deterministic 4xx are stored.
func TestStoragePolicy(t *testing.T) {
	t.Parallel()
	for _, code := range []int{500, 502, 503, 408, 409, 425, 429} {
		calls := 0
		mw, _ := newMiddleware(t, nil)
		h := mw.Handler(statusHandler(&calls, code))
		if w := do(h, http.MethodPost, "k", body1); w.Code != code {
			t.Fatalf("first: %d, want %d", w.Code, code)
		}
		if w := do(h, http.MethodPost, "k", body1); w.Code != http.StatusCreated || calls != 2 {
			t.Fatalf("%d: retry %d after %d calls; want re-execution", code, w.Code, calls)
		}
	}
	for _, code := range []int{400, 402, 404, 422, 303} {
		calls := 0
		mw, _ := newMiddleware(t, nil)
		h := mw.Handler(statusHandler(&calls, code))
		do(h, http.MethodPost, "k", body1)
		if w := do(h, http.MethodPost, "k", body1); w.Code != code || calls != 1 || w.Body.String() != http.StatusText(code) {
			t.Fatalf("%d: retry %d after %d calls; want replay", code, w.Code, calls)
		}
	}
	// Release forces a release whatever the status; a custom policy stores 503.
	calls := 0
	mw, _ := newMiddleware(t, &idemhttp.Config{ShouldStore: func(int) bool { return true }})
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		if calls == 1 && !idemhttp.Release(w) {
			t.Error("Release did not find the writer")
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	do(h, http.MethodPost, "k", body1)
	do(h, http.MethodPost, "k", body1)
	if w := do(h, http.MethodPost, "k", body1); calls != 2 || w.Code != http.StatusServiceUnavailable || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("calls = %d, code %d", calls, w.Code)
	}
	if idemhttp.Release(httptest.NewRecorder()) {
		t.Fatal("Release found a writer outside the middleware")
	}
}

// Acceptance 9: a panic releases the key and propagates, or becomes a 500.
func TestPanicReleases(t *testing.T) {
	t.Parallel()
	calls := 0
	boom := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		if calls == 1 {
			panic("boom")
		}
		w.WriteHeader(http.StatusCreated)
	})
	var events []idemhttp.Event
	mw, _ := newMiddleware(t, &idemhttp.Config{Hooks: []idem.Hook{endHook(func(_ context.Context, e idemhttp.Event) { events = append(events, e) })}})
	h := mw.Handler(boom)
	func() {
		defer func() {
			if v := recover(); v != "boom" {
				t.Fatalf("recovered %v, want the handler's panic", v)
			}
		}()
		do(h, http.MethodPost, "k", body1)
	}()
	if w := do(h, http.MethodPost, "k", body1); w.Code != http.StatusCreated || calls != 2 {
		t.Fatalf("retry after panic: %d, calls %d", w.Code, calls)
	}
	if len(events) != 2 || events[0].Outcome != idem.Panicked || events[1].Outcome != idem.Processed {
		t.Fatalf("events %+v", events)
	}

	calls = 0
	mw, _ = newMiddleware(t, &idemhttp.Config{RecoverPanics: true})
	h = mw.Handler(boom)
	wantProblem(t, do(h, http.MethodPost, "k", body1), http.StatusInternalServerError, idemhttp.TypeHandlerPanic)
	if w := do(h, http.MethodPost, "k", body1); w.Code != http.StatusCreated || calls != 2 {
		t.Fatalf("retry after recovered panic: %d, calls %d", w.Code, calls)
	}
	// http.ErrAbortHandler always propagates.
	mw, _ = newMiddleware(t, &idemhttp.Config{RecoverPanics: true})
	h = mw.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic(http.ErrAbortHandler) }))
	func() {
		defer func() {
			if v := recover(); v != http.ErrAbortHandler {
				t.Fatalf("recovered %v", v)
			}
		}()
		do(h, http.MethodPost, "k", body1)
	}()
}

// Acceptance 10: http.ResponseController reaches the real writer.
func TestResponseControllerFlush(t *testing.T) {
	t.Parallel()
	proceed := make(chan struct{})
	mw, _ := newMiddleware(t, nil)
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		io.WriteString(w, "first\n")
		if err := rc.Flush(); err != nil {
			t.Errorf("Flush: %v", err)
		}
		if err := rc.SetWriteDeadline(time.Now().Add(5 * time.Second)); err != nil {
			t.Errorf("SetWriteDeadline: %v", err)
		}
		<-proceed
		io.WriteString(w, "second\n")
		w.(http.Flusher).Flush()
	})))
	defer srv.Close()
	send := func() *http.Response {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/stream", strings.NewReader("x"))
		req.Header.Set("Idempotency-Key", "k")
		req.Header.Set("X-User", "alice")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	resp := send()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || line != "first\n" {
		t.Fatalf("first chunk %q, %v (flush did not reach the client)", line, err)
	}
	close(proceed)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	// A streamed response goes out before its record is written: until
	// then a retry gets 409.
	var b []byte
	for range 100 {
		resp = send()
		b, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusConflict {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if string(b) != "first\nsecond\n" || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay %q %v", b, resp.Header)
	}
}

// A response over the limit reaches the first caller; the key is a tombstone.
func TestLargeResponseTombstone(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", 4096)
	for name, cfg := range map[string]struct {
		mw    *idemhttp.Config
		store *idemtest.MemoryOptions
	}{
		"middleware limit": {&idemhttp.Config{MaxResponseBytes: 1000}, nil},
		"store limit":      {&idemhttp.Config{}, &idemtest.MemoryOptions{MaxResultBytes: 1000}},
	} {
		calls := 0
		cfg.mw.AllowNonDurable = true
		cfg.mw.Principal = idemhttp.PrincipalFromHeader("X-User")
		mw, err := idemhttp.New(idemtest.NewMemoryStore(cfg.store), cfg.mw)
		if err != nil {
			t.Fatal(err)
		}
		h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls++
			for range 4 {
				io.WriteString(w, big)
			}
		}))
		if w := do(h, http.MethodPost, "k", body1); w.Code != 200 || w.Body.Len() != 4*len(big) {
			t.Fatalf("%s: first caller got %d bytes", name, w.Body.Len())
		}
		w := do(h, http.MethodPost, "k", body1)
		wantProblem(t, w, http.StatusGone, idemhttp.TypeResultDiscarded)
		if calls != 1 {
			t.Fatalf("%s: calls = %d", name, calls)
		}
	}
}

func TestStoreUnavailable(t *testing.T) {
	t.Parallel()
	p := &payments{}
	mw, st := newMiddleware(t, nil)
	st.fail.Store(true)
	w := do(mw.Handler(p), http.MethodPost, "k", body1)
	wantProblem(t, w, http.StatusServiceUnavailable, idemhttp.TypeStoreUnavailable)
	if p.charges.Load() != 0 || w.Header().Get("Retry-After") == "" {
		t.Fatal("handler ran or no Retry-After")
	}
}

// A lease much shorter than the handler stays alive through heartbeats.
func TestShortLeaseHeartbeat(t *testing.T) {
	t.Parallel()
	p := &payments{delay: 2500 * time.Millisecond}
	mw, _ := newMiddleware(t, &idemhttp.Config{Lease: time.Second})
	h := mw.Handler(p)
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- do(h, http.MethodPost, "k", body1) }()
	time.Sleep(1700 * time.Millisecond) // well past the first lease
	wantProblem(t, do(h, http.MethodPost, "k", body1), http.StatusConflict, idemhttp.TypeKeyInFlight)
	if w := <-done; w.Code != http.StatusCreated || p.charges.Load() != 1 {
		t.Fatalf("first %d, charges %d", w.Code, p.charges.Load())
	}
}

func TestCheck(t *testing.T) {
	t.Parallel()
	mw, _ := newMiddleware(t, &idemhttp.Config{SignificantHeaders: []string{"X-Tenant"}})
	r := httptest.NewRequest(http.MethodGet, "/x", nil)
	if _, err := mw.Check(r); !errors.Is(err, idemhttp.ErrNotCovered) {
		t.Fatalf("GET: %v", err)
	}
	mk := func(tenant string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/x", strings.NewReader(body1))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Idempotency-Key", `"k"`)
		r.Header.Set("X-User", "u")
		r.Header.Set("X-Tenant", tenant)
		return r
	}
	r = mk("t1")
	c1, err := mw.Check(r)
	if err != nil || c1.Key != "k" || c1.Fingerprint.IsZero() {
		t.Fatalf("%+v %v", c1, err)
	}
	if b, _ := io.ReadAll(r.Body); string(b) != body1 {
		t.Fatalf("body not restored: %q", b)
	}
	c2, _ := mw.Check(mk("t2"))
	if c1.Fingerprint == c2.Fingerprint || c1.Scope != c2.Scope {
		t.Fatal("significant header does not change the fingerprint")
	}
	raw := mk("t1")
	raw.Header.Set("Content-Type", "text/plain")
	if c3, _ := mw.Check(raw); c3.Fingerprint == c1.Fingerprint {
		t.Fatal("the same bytes as JSON and as text/plain share a fingerprint")
	}
	r.Header.Del("Idempotency-Key")
	r.Header.Add("Idempotency-Key", "a")
	r.Header.Add("Idempotency-Key", "b")
	var p *idemhttp.Problem
	if _, err := mw.Check(r); !errors.As(err, &p) || p.Type != idemhttp.TypeKeyInvalid || !errors.Is(err, idem.ErrInvalidKey) {
		t.Fatalf("two keys: %v", err)
	}
	res, err := mw.Guard().Do(context.Background(), c1, func(context.Context, idem.Run) ([]byte, error) { return []byte("ok"), nil })
	if err != nil || string(res.Value) != "ok" {
		t.Fatal(res, err)
	}
}

func TestCustomErrorHandlerAndEvents(t *testing.T) {
	t.Parallel()
	var got []idemhttp.Event
	mw, _ := newMiddleware(t, &idemhttp.Config{
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, p *idemhttp.Problem) {
			w.WriteHeader(p.Status)
			io.WriteString(w, "custom:"+p.Type)
		},
		Hooks: []idem.Hook{endHook(func(_ context.Context, e idemhttp.Event) { got = append(got, e) })},
	})
	h := mw.Handler(&payments{})
	do(h, http.MethodPost, "k", body1)
	do(h, http.MethodPost, "k", body1)
	w := do(h, http.MethodPost, "k", `{"amount":5}`)
	if w.Body.String() != "custom:"+idemhttp.TypeKeyReused {
		t.Fatalf("body %q", w.Body)
	}
	do(h, http.MethodPost, "", body1) // pass-through: no event
	want := []idem.Outcome{idem.Processed, idem.Duplicate, idem.Mismatch}
	if len(got) != len(want) {
		t.Fatalf("events %+v", got)
	}
	for i, e := range got {
		if e.Outcome != want[i] || e.Key != "k" || len(e.ScopeHash) != 16 {
			t.Fatalf("event %d: %+v", i, e)
		}
	}
}

func TestInvalidStatusPanicsAndReleases(t *testing.T) {
	t.Parallel()
	calls := 0
	mw, _ := newMiddleware(t, &idemhttp.Config{RecoverPanics: true})
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		if calls == 1 {
			w.WriteHeader(42)
		}
		w.WriteHeader(http.StatusAccepted)
	}))
	wantProblem(t, do(h, http.MethodPost, "k", body1), http.StatusInternalServerError, idemhttp.TypeHandlerPanic)
	if w := do(h, http.MethodPost, "k", body1); w.Code != http.StatusAccepted || calls != 2 {
		t.Fatalf("%d after %d calls", w.Code, calls)
	}
}

func TestConfigNotModified(t *testing.T) {
	t.Parallel()
	sig := []string{"x-tenant"}
	newMiddleware(t, &idemhttp.Config{SignificantHeaders: sig})
	if sig[0] != "x-tenant" {
		t.Fatalf("New modified the caller's slice: %q", sig)
	}
}

// A retry that waits for an in-flight first request and whose client goes
// away is reported as canceled, not as a store failure.
func TestWaitCanceled(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var events sync.Map
	mw, _ := newMiddleware(t, &idemhttp.Config{Wait: 10 * time.Second, Hooks: []idem.Hook{endHook(func(_ context.Context, e idemhttp.Event) {
		events.Store(e.Request.Header.Get("X-Req"), e)
	})}})
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release
		w.WriteHeader(http.StatusCreated)
	}))
	first := make(chan *httptest.ResponseRecorder)
	go func() { first <- do(h, http.MethodPost, "k", body1, withHeader("X-Req", "first")) }()
	time.Sleep(100 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/payments", strings.NewReader(body1))
	r.Header.Set("X-User", "alice")
	r.Header.Set("X-Req", "second")
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Idempotency-Key", "k")
	h.ServeHTTP(httptest.NewRecorder(), r)
	close(release)
	if w := <-first; w.Code != http.StatusCreated {
		t.Fatal(w.Code)
	}
	e, _ := events.Load("second")
	if ev, _ := e.(idemhttp.Event); ev.Outcome != idem.Canceled || ev.Status != 499 {
		t.Fatalf("event %+v", e)
	}
}
