package sdktest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
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
	"github.com/idem-go/idem/idemtest"
)

// Special parameter values the fake and the store react to, so that a
// client (Go or Node) can steer a case through the SDK's ordinary API.
const (
	// holdDescription makes the fake block in its handler until the test
	// releases it, so that a second request with the same key arrives while
	// the first is in flight.
	holdDescription = "hold"
	// storeDownPrefix makes the store's Claim fail (idem.Retryable) for
	// every key that starts with it.
	storeDownPrefix = "store-down-"
	// waitLimit bounds every wait for an event, so that a broken test fails
	// instead of hanging. Generous: the machine may be loaded.
	waitLimit = 30 * time.Second
)

// fakeStripe is a tiny stand-in for Stripe's POST /v1/customers. It is
// not idempotent by itself: every call creates a new customer with a new
// id and answers with a new Request-Id, as Stripe does. It does not echo
// the Idempotency-Key, so an echo the client sees comes from idemhttp.
type fakeStripe struct {
	executions atomic.Int64
	seq        atomic.Int64

	entered     chan struct{} // one value per held request that reached the handler
	release     chan struct{} // closed to let held requests finish
	releaseOnce sync.Once
}

func newFakeStripe() *fakeStripe {
	return &fakeStripe{entered: make(chan struct{}, 16), release: make(chan struct{})}
}

func (f *fakeStripe) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/customers" {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, `{"error":{"type":"invalid_request_error","message":"Unrecognized request URL"}}`)
		return
	}
	if err := r.ParseForm(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if r.PostForm.Get("description") == holdDescription {
		f.entered <- struct{}{}
		select {
		case <-f.release:
		case <-time.After(2 * waitLimit): // never hang a broken test for ever
		}
	}
	n := f.seq.Add(1)
	f.executions.Add(1)
	body, _ := json.Marshal(map[string]any{
		"id":          fmt.Sprintf("cus_sdktest%06d", n),
		"object":      "customer",
		"email":       r.PostForm.Get("email"),
		"description": r.PostForm.Get("description"),
		"created":     time.Now().Unix(),
		"livemode":    false,
	})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Request-Id", fmt.Sprintf("req_sdktest%06d", n))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}

// waitEntered waits until a held request has reached the handler.
func (f *fakeStripe) waitEntered(ctx context.Context) error {
	select {
	case <-f.entered:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (f *fakeStripe) releaseHeld() { f.releaseOnce.Do(func() { close(f.release) }) }

// flakyStore is a store whose Claim fails with a retryable error for the
// keys that start with storeDownPrefix: "the store is down" without
// stopping the whole store.
type flakyStore struct{ idem.Store }

func (s flakyStore) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	if strings.HasPrefix(req.Key, storeDownPrefix) {
		return idem.Claim{}, idem.Retryable(errors.New("sdktest: the store is unreachable"))
	}
	return s.Store.Claim(ctx, req)
}

// mode is how idemhttp is put in front of the fake.
type mode string

const (
	// direct: the middleware wraps the fake's handler in one server.
	direct mode = "middleware"
	// proxied: idemhttp.NewProxy in front of the fake as a separate
	// upstream server.
	proxied mode = "proxy"
	// bare: the fake alone, without idemhttp (the control).
	bare mode = "bare"
)

var modes = []mode{direct, proxied}

// env is one server under test.
type env struct {
	URL  string
	fake *fakeStripe
	// attempts counts the HTTP requests that reached the front server
	// (what the SDK sent), control endpoints excluded.
	attempts atomic.Int64
}

// newEnv starts a server: the fake behind idemhttp in mode m, with the
// given error format, RequireKey, a principal from the Authorization
// header and an in-memory store. Besides the API it serves control
// endpoints under /_sdktest/ (for the Node script): GET stats, POST
// wait-entered and POST release.
func newEnv(t *testing.T, m mode, format idemhttp.ErrorFormat) *env {
	t.Helper()
	e := &env{fake: newFakeStripe()}
	var api http.Handler = e.fake
	if m != bare {
		mw, err := idemhttp.New(flakyStore{idemtest.NewMemoryStore(nil)}, &idemhttp.Config{
			RequireKey:      true,
			Principal:       idemhttp.PrincipalFromAuthorization(),
			ErrorFormat:     format,
			AllowNonDurable: true, // idemtest.MemoryStore: a unit-test store
			Logger:          slog.New(slog.DiscardHandler),
		})
		if err != nil {
			t.Fatal(err)
		}
		switch m {
		case direct:
			api = mw.Handler(e.fake)
		case proxied:
			up := httptest.NewServer(e.fake)
			t.Cleanup(up.Close)
			u, _ := url.Parse(up.URL)
			if api, err = idemhttp.NewProxy(u, mw, &idemhttp.ProxyConfig{Logger: slog.New(slog.DiscardHandler)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /_sdktest/stats", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]int64{
			"attempts": e.attempts.Load(), "executions": e.fake.executions.Load(),
		})
	})
	mux.HandleFunc("POST /_sdktest/wait-entered", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), waitLimit)
		defer cancel()
		if err := e.fake.waitEntered(ctx); err != nil {
			http.Error(w, "no held request reached the handler: "+err.Error(), http.StatusGatewayTimeout)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /_sdktest/release", func(w http.ResponseWriter, _ *http.Request) {
		e.fake.releaseHeld()
		w.WriteHeader(http.StatusNoContent)
	})
	mux.Handle("/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.attempts.Add(1)
		api.ServeHTTP(w, r)
	}))
	srv := httptest.NewServer(mux)
	e.URL = srv.URL
	// Cleanups run last-in first-out: held requests are released before
	// the servers wait for them.
	t.Cleanup(srv.Close)
	t.Cleanup(e.fake.releaseHeld)
	return e
}
