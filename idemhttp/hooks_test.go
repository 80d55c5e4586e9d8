package idemhttp_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
)

// hookKey is the context key under which a recordingHook's start hooks
// leave a value: its name and "request" or "do".
type hookKey struct{ name, kind string }

// journal is what a test's recordingHooks saw, in order.
type journal struct {
	mu       sync.Mutex
	calls    []string
	requests []idemhttp.Event // end events
	dos      []idem.DoEvent   // end events
}

func (j *journal) add(call string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.calls = append(j.calls, call)
}

func (j *journal) snapshot() ([]string, []idemhttp.Event, []idem.DoEvent) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.calls), slices.Clone(j.requests), slices.Clone(j.dos)
}

// recordingHook implements the request hooks and the Guard's. Its start
// hooks add a value to the context; its end hooks check that the context
// they get holds it. Calls go to journal, when it is set.
type recordingHook struct {
	name    string
	journal *journal
	t       testing.TB
}

func (h *recordingHook) note(call string) {
	if h.journal != nil {
		h.journal.add(h.name + " " + call)
	}
}

func (h *recordingHook) OnRequestStart(ctx context.Context, ev idemhttp.Event) context.Context {
	h.note("request start")
	if h.t != nil && (ev.Request == nil || ev.Outcome != "" || ev.Status != 0 || ev.Duration != 0) {
		h.t.Errorf("%s: request start event %+v", h.name, ev)
	}
	return context.WithValue(ctx, hookKey{h.name, "request"}, true)
}

func (h *recordingHook) OnRequestEnd(ctx context.Context, ev idemhttp.Event) {
	h.note("request end")
	if h.t != nil && (ctx.Value(hookKey{h.name, "request"}) == nil || ev.Request.Context() != ctx) {
		h.t.Errorf("%s: request end without the start hook's context", h.name)
	}
	if h.journal != nil {
		h.journal.mu.Lock()
		h.journal.requests = append(h.journal.requests, ev)
		h.journal.mu.Unlock()
	}
}

func (h *recordingHook) OnDoStart(ctx context.Context, ev idem.DoEvent) context.Context {
	h.note("do start")
	return context.WithValue(ctx, hookKey{h.name, "do"}, true)
}

func (h *recordingHook) OnDoEnd(ctx context.Context, ev idem.DoEvent) {
	h.note("do end")
	if h.t != nil && ctx.Value(hookKey{h.name, "do"}) == nil {
		h.t.Errorf("%s: do end without the start hook's context", h.name)
	}
	if h.journal != nil {
		h.journal.mu.Lock()
		h.journal.dos = append(h.journal.dos, ev)
		h.journal.mu.Unlock()
	}
}

// Every hook is called, in order; the start hooks' contexts reach the
// handler and the end hooks; the Guard underneath gets the same hooks.
func TestHooksOrderAndContext(t *testing.T) {
	t.Parallel()
	j := &journal{}
	a, b := &recordingHook{name: "a", journal: j, t: t}, &recordingHook{name: "b", journal: j, t: t}
	mw, _ := newMiddleware(t, &idemhttp.Config{Hooks: []idem.Hook{a, "not a hook", b}})
	var missing []string
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, k := range []hookKey{{"a", "request"}, {"b", "request"}, {"a", "do"}, {"b", "do"}} {
			if r.Context().Value(k) == nil {
				missing = append(missing, k.name+" "+k.kind)
			}
		}
		time.Sleep(time.Millisecond)
		w.WriteHeader(http.StatusCreated)
	}))
	do(h, http.MethodPost, "k", body1)
	if len(missing) > 0 {
		t.Fatalf("the handler's context lacks the start hooks' values %v", missing)
	}
	calls, requests, dos := j.snapshot()
	want := []string{"a request start", "b request start", "a do start", "b do start", "a do end", "b do end",
		"a request end", "b request end"}
	if !slices.Equal(calls, want) {
		t.Fatalf("calls\n%q\nwant\n%q", calls, want)
	}
	ev := requests[0]
	if ev != requests[1] || ev.Outcome != idem.Processed || ev.Status != http.StatusCreated || ev.Key != "k" ||
		ev.Duration < time.Millisecond || ev.Request == nil || ev.Request.URL.Path != "/payments" {
		t.Fatalf("request event %+v", ev)
	}
	if ev.ScopeHash != idem.ScopeHash(dos[0].Scope) || len(ev.ScopeHash) != 16 || dos[0].Outcome != idem.Processed {
		t.Fatalf("request event's scope hash %q, Guard's scope %q (outcome %v)", ev.ScopeHash, dos[0].Scope, dos[0].Outcome)
	}

	// A replay runs no handler; the hooks see it as a duplicate.
	j2 := &journal{}
	a.journal, b.journal = j2, j2
	if w := do(h, http.MethodPost, "k", body1); w.Header().Get(idemhttp.ReplayedHeader) != "true" {
		t.Fatalf("not replayed: %d", w.Code)
	}
	calls, requests, dos = j2.snapshot()
	if len(calls) != 8 || requests[0].Outcome != idem.Duplicate || dos[0].Outcome != idem.Duplicate {
		t.Fatalf("replay: calls %q, request %+v, do %+v", calls, requests, dos)
	}
}

// A pass-through is not reported; a rejected request is, with the parts of
// it known when it was rejected, and without touching the Guard.
func TestHooksPassThroughAndRejected(t *testing.T) {
	t.Parallel()
	j := &journal{}
	mw, st := newMiddleware(t, &idemhttp.Config{Hooks: []idem.Hook{&recordingHook{name: "h", journal: j, t: t}}})
	h := mw.Handler(&payments{})
	do(h, http.MethodGet, "k", "")
	do(h, http.MethodPost, "", body1)
	if calls, _, _ := j.snapshot(); len(calls) != 0 {
		t.Fatalf("pass-throughs reported: %q", calls)
	}
	do(h, http.MethodPost, "k", body1, withHeader("X-User", "")) // no principal: no scope
	do(h, http.MethodPost, "k", `{"amount":`)                    // invalid JSON: the scope is known
	do(h, http.MethodPost, `"bad key`, body1)                    // invalid key
	calls, requests, _ := j.snapshot()
	if want := 6; len(calls) != want || st.claims.Load() != 0 {
		t.Fatalf("calls %q (want %d), %d claims", calls, want, st.claims.Load())
	}
	for i, want := range []struct {
		key   string
		scope bool
	}{{"k", false}, {"k", true}, {"", false}} {
		ev := requests[i]
		if ev.Outcome != idem.Rejected || ev.Status != http.StatusBadRequest || ev.Key != want.key || (ev.ScopeHash != "") != want.scope {
			t.Errorf("rejection %d: %+v", i, ev)
		}
	}
}

// The proxy's upstream call runs with the context the start hooks
// returned, so a span they start is the parent of the client span.
func TestHooksContextReachesUpstream(t *testing.T) {
	t.Parallel()
	up := startServer(t, &upstreamAPI{})
	j := &journal{}
	mw, _ := newMiddleware(t, &idemhttp.Config{Principal: idemhttp.PrincipalFromAuthorization(),
		Hooks: []idem.Hook{&recordingHook{name: "h", journal: j, t: t}}})
	u, _ := url.Parse(up.URL)
	seen := make(chan [2]bool, 1)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	proxy, err := idemhttp.NewProxy(u, mw, &idemhttp.ProxyConfig{
		Transport: roundTripper(func(r *http.Request) (*http.Response, error) {
			seen <- [2]bool{r.Context().Value(hookKey{"h", "request"}) != nil, r.Context().Value(hookKey{"h", "do"}) != nil}
			return tr.RoundTrip(r)
		}),
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	w := do(proxy, http.MethodPost, "k", body1, withHeader("Authorization", "Bearer alice"))
	if w.Code != http.StatusCreated {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	if got := <-seen; !got[0] || !got[1] {
		t.Fatalf("the upstream request's context holds the request start hook's value %v, the Guard's %v", got[0], got[1])
	}
	if _, requests, _ := j.snapshot(); len(requests) != 1 || requests[0].Outcome != idem.Processed {
		t.Fatalf("events %+v", requests)
	}
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A hook implementing only idem.DoEndHook sees each execution's
// heartbeats, as Config.OnDo did.
func TestHooksSeeHeartbeats(t *testing.T) {
	t.Parallel()
	dos := make(chan idem.DoEvent, 1)
	mw, _ := newMiddleware(t, &idemhttp.Config{Lease: 150 * time.Millisecond,
		Hooks: []idem.Hook{doEndHook(func(_ context.Context, ev idem.DoEvent) { dos <- ev })}})
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(300 * time.Millisecond) // several heartbeats at Lease/3
		io.WriteString(w, "done")
	}))
	do(h, http.MethodPost, "k", body1)
	if ev := <-dos; ev.Outcome != idem.Processed || ev.Heartbeats == 0 {
		t.Fatalf("do event %+v", ev)
	}
}

type doEndHook func(ctx context.Context, ev idem.DoEvent)

func (f doEndHook) OnDoEnd(ctx context.Context, ev idem.DoEvent) { f(ctx, ev) }

func ExampleScope() {
	// The scope a request's key is filed under, and the hash its events
	// and logs carry in place of it.
	scope := idemhttp.Scope("alice", "post", "POST /payments")
	fmt.Println(scope, idem.ScopeHash(scope))
	// Output: http "alice" POST POST /payments f8b4a80eac8d4475
}
