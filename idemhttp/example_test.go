package idemhttp_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"time"

	"github.com/idem-go/idem"

	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemtest"
)

// A payment endpoint that charges once per Idempotency-Key, whatever the
// number of retries.
func ExampleMiddleware() {
	// Production code passes a durable store (idemsqlite, idempgx); the
	// memory store is for examples and tests only.
	store := idemtest.NewMemoryStore(nil)
	mw, err := idemhttp.New(store, &idemhttp.Config{
		// The principal comes from your authentication; here a header for brevity.
		Principal:       idemhttp.PrincipalFromHeader("X-User"),
		RequireKey:      true,
		AllowNonDurable: true,
	})
	if err != nil {
		panic(err)
	}
	charges := 0
	mux := http.NewServeMux()
	mux.Handle("POST /payments", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"charge":"ch_%d"}`, charges)
	})))

	send := func(key, body string) {
		r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("X-User", "alice")
		if key != "" {
			r.Header.Set("Idempotency-Key", key)
		}
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Header().Get("Idempotent-Replayed"), strings.TrimSpace(w.Body.String()))
	}
	send(`"pay-1"`, `{"amount":100,"currency":"eur"}`)
	send(`"pay-1"`, `{"currency":"eur", "amount":100}`) // a retry: same JSON, reordered
	send(`"pay-1"`, `{"amount":500,"currency":"eur"}`)  // the key reused for another payment
	send("", `{"amount":100}`)                          // no key on a route that requires one
	fmt.Println("charges:", charges)
	// Output:
	// 201  {"charge":"ch_1"}
	// 201 true {"charge":"ch_1"}
	// 422  {"type":"https://idem-go.dev/problems/key-reused","title":"Idempotency-Key reused with a different request","status":422,"detail":"this key was already used with a different method, path, body or significant header","code":"idempotency_key_reused"}
	// 400  {"type":"https://idem-go.dev/problems/key-missing","title":"Idempotency-Key required","status":400,"detail":"this endpoint requires an Idempotency-Key header","code":"idempotency_key_missing"}
	// charges: 1
}

// accessLog is a hook of your own: an idemhttp.RequestEndHook that logs
// each request the middleware handled. The same value could implement the
// start hook too, or idem.DoEndHook for the Guard's executions.
type accessLog struct{}

func (accessLog) OnRequestEnd(_ context.Context, ev idemhttp.Event) {
	fmt.Println(ev.Request.Method, ev.Request.Pattern, ev.Outcome, ev.Status, len(ev.ScopeHash))
}

// Observe the middleware with hooks: your own beside contrib/idemprom's
// Metrics and contrib/idemotel's Telemetry (Hooks: []idem.Hook{metrics,
// tel, accessLog{}}).
func ExampleConfig_hooks() {
	mw, err := idemhttp.New(idemtest.NewMemoryStore(nil), &idemhttp.Config{
		Principal:       idemhttp.PrincipalFromHeader("X-User"),
		AllowNonDurable: true,
		Hooks:           []idem.Hook{accessLog{}},
	})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})))
	for range 2 {
		r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{}`))
		r.Header.Set("X-User", "alice")
		r.Header.Set("Idempotency-Key", `"pay-1"`)
		mux.ServeHTTP(httptest.NewRecorder(), r)
	}
	// Output:
	// POST POST /payments processed 201 16
	// POST POST /payments duplicate 201 16
}

// Callers that build their own responses use Check and the Guard directly.
func ExampleMiddleware_Check() {
	mw, _ := idemhttp.New(idemtest.NewMemoryStore(nil), &idemhttp.Config{
		SharedScope: true, AllowNonDurable: true,
	})
	r := httptest.NewRequest(http.MethodPost, "/jobs", strings.NewReader(`{"n":1}`))
	r.Header.Set("Idempotency-Key", `"job-7"`)
	call, err := mw.Check(r)
	fmt.Println(call.Key, err)

	r.Header.Add("Idempotency-Key", "again")
	_, err = mw.Check(r)
	fmt.Println(err.(*idemhttp.Problem).Type)
	// Output:
	// job-7 <nil>
	// https://idem-go.dev/problems/key-invalid
}

// The library form of the `idem proxy` sidecar: any HTTP API, in any
// language, behind an idempotency layer.
func ExampleNewProxy() {
	var store idem.Store = idemtest.NewMemoryStore(nil) // use idemsqlite or idempgx
	mw, err := idemhttp.New(store, &idemhttp.Config{
		// Keys belong to the caller's credential; a gateway-authenticated
		// principal header works too (PrincipalFromHeader).
		Principal:       idemhttp.PrincipalFromAuthorization(),
		AllowNonDurable: true,
	})
	if err != nil {
		panic(err)
	}
	upstream, _ := url.Parse("http://127.0.0.1:9000")
	proxy, err := idemhttp.NewProxy(upstream, mw, &idemhttp.ProxyConfig{Timeout: 30 * time.Second})
	if err != nil {
		panic(err)
	}
	srv := &http.Server{Addr: "127.0.0.1:8080", Handler: proxy, ReadHeaderTimeout: 10 * time.Second}
	_ = srv // srv.ListenAndServe()
}
