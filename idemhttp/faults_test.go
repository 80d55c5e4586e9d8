package idemhttp_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/idemtest/faultnet"
)

// These tests drive the middleware over real TCP: real net/http servers and
// clients, with faultnet relays breaking the client's hop where a test
// needs a client to vanish. Nothing in them asserts how fast something
// happens; every wait is on an event, bounded by patience only so that a
// bug fails the test instead of hanging it.

// patience bounds every wait. Nothing is expected to take anywhere near
// this long, even on a loaded machine.
const patience = 30 * time.Second

// recv receives from ch (or sees it closed) or fails the test after
// patience.
func recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(patience):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// hold blocks a handler until ch is closed or the test ends (so that a
// failed test never leaves a handler blocking its server's Close). It
// reports whether ch was closed.
func hold(t testing.TB, ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	case <-t.Context().Done():
		return false
	}
}

// startServer serves h on a loopback port until the test ends.
func startServer(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// startRelay starts a faultnet relay to target that is closed when the
// test ends.
func startRelay(t *testing.T, target string) *faultnet.Relay {
	t.Helper()
	r, err := faultnet.Start(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// newClient returns a client with a transport of its own that opens a
// connection per request: net/http never re-sends a request on a fresh
// connection by itself, so every attempt a test makes is one request.
func newClient(t testing.TB) *http.Client {
	tr := &http.Transport{DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: patience}
}

// answer is a whole response as a client saw it.
type answer struct {
	status int
	header http.Header
	body   string
}

func (a answer) String() string { return fmt.Sprintf("%d %q %v", a.status, a.body, a.header) }

// newRequest builds a JSON request as user alice with the key (none if
// key is "").
func newRequest(t testing.TB, method, url, key, body string, opts ...reqOpt) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-User", "alice")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for _, o := range opts {
		o(req)
	}
	return req
}

// exchange sends req and reads the whole response.
func exchange(c *http.Client, req *http.Request) (answer, error) {
	resp, err := c.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, string(b)}, err
}

// send sends a request and fails the test if it does not get a whole
// response.
func send(t testing.TB, c *http.Client, method, url, key, body string, opts ...reqOpt) answer {
	t.Helper()
	a, err := exchange(c, newRequest(t, method, url, key, body, opts...))
	if err != nil {
		t.Fatalf("%s %s key %q: %v", method, url, key, err)
	}
	return a
}

// problemOf decodes a problem+json answer and checks that its status
// matches the response's.
func problemOf(t testing.TB, a answer) idemhttp.Problem {
	t.Helper()
	if ct := a.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json: %v", ct, a)
	}
	var p idemhttp.Problem
	if err := json.Unmarshal([]byte(a.body), &p); err != nil {
		t.Fatalf("problem body: %v: %v", err, a)
	}
	if p.Status != a.status {
		t.Fatalf("problem status %d, response status %d", p.Status, a.status)
	}
	return p
}

func wantProblemAnswer(t testing.TB, a answer, status int, typ string) idemhttp.Problem {
	t.Helper()
	if a.status != status {
		t.Fatalf("status %d, want %d: %v", a.status, status, a)
	}
	p := problemOf(t, a)
	if p.Type != typ {
		t.Fatalf("problem type %q, want %q: %v", p.Type, typ, a)
	}
	return p
}

// wantInFlight checks a 409 in-flight answer.
func wantInFlight(t testing.TB, a answer) {
	t.Helper()
	wantProblemAnswer(t, a, http.StatusConflict, idemhttp.TypeKeyInFlight)
	if a.header.Get("Retry-After") == "" {
		t.Fatalf("409 without Retry-After: %v", a)
	}
}

// wantReplay checks that a is the replay of first.
func wantReplay(t testing.TB, a, first answer) {
	t.Helper()
	if a.status != first.status || a.body != first.body || a.header.Get(idemhttp.ReplayedHeader) != "true" {
		t.Fatalf("want the replay of %v, got %v", first, a)
	}
}

// eventLog keeps the middleware's events by the request's X-Req header.
type eventLog struct {
	mu     sync.Mutex
	events map[string]idemhttp.Event
	seen   map[string]chan struct{}
}

func newEventLog() *eventLog {
	return &eventLog{events: map[string]idemhttp.Event{}, seen: map[string]chan struct{}{}}
}

func (l *eventLog) chLocked(id string) chan struct{} {
	ch := l.seen[id]
	if ch == nil {
		ch = make(chan struct{})
		l.seen[id] = ch
	}
	return ch
}

// OnRequestEnd makes the log an idemhttp.RequestEndHook. Requests without
// an X-Req are not kept.
func (l *eventLog) OnRequestEnd(_ context.Context, e idemhttp.Event) {
	id := e.Request.Header.Get("X-Req")
	if id == "" {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, dup := l.events[id]; dup {
		panic("two events for request " + id)
	}
	l.events[id] = e
	close(l.chLocked(id))
}

// await returns the event of request id once it has been reported: the
// middleware is done with that request, its record written.
func (l *eventLog) await(t testing.TB, id string) idemhttp.Event {
	t.Helper()
	l.mu.Lock()
	ch := l.chLocked(id)
	l.mu.Unlock()
	recv(t, ch, "the event of request "+id)
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.events[id]
}

func reqID(id string) reqOpt { return func(r *http.Request) { r.Header.Set("X-Req", id) } }

// hookStore is a memory store whose calls a test can intercept.
type hookStore struct {
	*idemtest.MemoryStore
	claim    func(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error)
	complete func(ctx context.Context, req idem.CompleteRequest) error
	extend   func(ctx context.Context, scope, key string, token int64, lease time.Duration) (time.Time, error)

	mu     sync.Mutex
	claims []idem.Claim // successful claims, in order
	scope  string       // the scope of the last claim
}

func (s *hookStore) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	var (
		c   idem.Claim
		err error
	)
	if s.claim != nil {
		c, err = s.claim(ctx, req)
	} else {
		c, err = s.MemoryStore.Claim(ctx, req)
	}
	if err == nil {
		s.mu.Lock()
		s.claims = append(s.claims, c)
		s.scope = req.Scope
		s.mu.Unlock()
	}
	return c, err
}

func (s *hookStore) Complete(ctx context.Context, req idem.CompleteRequest) error {
	if s.complete != nil {
		return s.complete(ctx, req)
	}
	return s.MemoryStore.Complete(ctx, req)
}

func (s *hookStore) Extend(ctx context.Context, scope, key string, token int64, lease time.Duration) (time.Time, error) {
	if s.extend != nil {
		return s.extend(ctx, scope, key, token, lease)
	}
	return s.MemoryStore.Extend(ctx, scope, key, token, lease)
}

func (s *hookStore) lastScope() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.scope
}

func (s *hookStore) claimed() []idem.Claim {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]idem.Claim(nil), s.claims...)
}

// newHookMiddleware builds a middleware over st, the principal from X-User
// unless cfg says otherwise.
func newHookMiddleware(t testing.TB, st idem.Store, cfg *idemhttp.Config) *idemhttp.Middleware {
	t.Helper()
	cfg.AllowNonDurable = true
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Principal == nil && !cfg.SharedScope {
		cfg.Principal = idemhttp.PrincipalFromHeader("X-User")
	}
	mw, err := idemhttp.New(st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return mw
}

// watchClient wraps h so that, for the request whose X-Req is id, gone is
// closed when the server sees that request's client go away (its
// r.Context() ends while the handler still runs).
func watchClient(h http.Handler, id string, gone chan<- struct{}) http.Handler {
	var once sync.Once
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Req") == id {
			stop := context.AfterFunc(r.Context(), func() { once.Do(func() { close(gone) }) })
			defer stop()
		}
		h.ServeHTTP(w, r)
	})
}

// cutClient is the fault that delivers a request and then resets both
// sides, so the server sees its client vanish once the request is in:
// possibly before the handler starts, which is what tests of a client
// that leaves early want.
var cutClient = faultnet.Fault{CutAfterRequest: 1, CutTarget: true}

// cutAfterStart sends req through a new relay to target that resets the
// client once its request is through, but leaves the server's side open
// until started is signalled: then it closes the relay, so the server sees
// its client vanish, strictly after the handler started. It returns once
// the client has failed and the handler has started.
func cutAfterStart(t *testing.T, target string, req *http.Request, started <-chan struct{}) {
	t.Helper()
	relay := startRelay(t, target)
	relay.Set(faultnet.Fault{CutAfterRequest: 1})
	u := *req.URL
	u.Host = relay.Addr()
	req.URL, req.Host = &u, ""
	if a, err := exchange(newClient(t), req); err == nil {
		t.Fatalf("the cut client got an answer: %v", a)
	}
	recv(t, started, "the handler to start")
	_ = relay.Close()
}

// 1. A client that disconnects once its request has reached the handler
// neither cancels nor repeats it: the handler runs once, on a context that
// stays alive, its response is recorded; a retry gets 409 while it runs and
// the replay after.
func TestFaultClientCutAfterRequest(t *testing.T) {
	t.Parallel()
	var execs atomic.Int64
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	ctxErr := make(chan error, 1)
	log := newEventLog()
	mw, _ := newMiddleware(t, &idemhttp.Config{Hooks: []idem.Hook{log}})
	gone := make(chan struct{})
	srv := startServer(t, watchClient(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := execs.Add(1)
		started <- struct{}{}
		hold(t, release)
		ctxErr <- r.Context().Err()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Request-Id", "req-1")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"charge":%d}`, n)
	})), "first", gone))

	cutAfterStart(t, srv.Listener.Addr().String(), newRequest(t, http.MethodPost, srv.URL+"/pay", "k1", body1, reqID("first")), started)
	recv(t, gone, "the server to see the client go")

	// The handler still runs: a retry is told to come back later.
	wantInFlight(t, send(t, newClient(t), http.MethodPost, srv.URL+"/pay", "k1", body1, reqID("retry-1")))

	close(release)
	if err := recv(t, ctxErr, "the handler to finish"); err != nil {
		t.Fatalf("the handler's context ended when its client left: %v", err)
	}
	ev := log.await(t, "first")
	if ev.Outcome != idem.Processed || ev.Status != http.StatusCreated {
		t.Fatalf("first request's event %+v, want executed 201", ev)
	}
	if !ev.ClientGone {
		t.Errorf("first request's event %+v: ClientGone not set, though its client left while it ran", ev)
	}
	a := send(t, newClient(t), http.MethodPost, srv.URL+"/pay", "k1", body1, reqID("retry-2"))
	wantReplay(t, a, answer{status: http.StatusCreated, body: `{"charge":1}`})
	if a.header.Get("X-Request-Id") != "req-1" {
		t.Errorf("replay without the handler's X-Request-Id: %v", a)
	}
	if n := execs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times for one key, want 1", n)
	}
}

// 2. A client whose own timeout is shorter than the handler: the same.
func TestFaultClientTimeout(t *testing.T) {
	t.Parallel()
	var execs atomic.Int64
	ctxErr := make(chan error, 1)
	log := newEventLog()
	mw, _ := newMiddleware(t, &idemhttp.Config{Hooks: []idem.Hook{log}})
	gone := make(chan struct{})
	srv := startServer(t, watchClient(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := execs.Add(1)
		hold(t, gone) // until the client has given up
		ctxErr <- r.Context().Err()
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprintf(w, "job %d", n)
	})), "first", gone))

	impatient := newClient(t)
	impatient.Timeout = 200 * time.Millisecond
	if a, err := exchange(impatient, newRequest(t, http.MethodPost, srv.URL+"/jobs", "k2", body1, reqID("first"))); err == nil {
		t.Fatalf("the client did not time out: %v", a)
	}
	if err := recv(t, ctxErr, "the handler to finish"); err != nil {
		t.Fatalf("the handler's context ended with its client's timeout: %v", err)
	}
	if ev := log.await(t, "first"); ev.Outcome != idem.Processed || ev.Status != http.StatusAccepted {
		t.Fatalf("event %+v", ev)
	}
	a := send(t, newClient(t), http.MethodPost, srv.URL+"/jobs", "k2", body1)
	wantReplay(t, a, answer{status: http.StatusAccepted, body: "job 1"})
	if n := execs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1", n)
	}
}

// readEvents reads n server-sent events ("data: …\n\n") from r.
func readEvents(t testing.TB, r *bufio.Reader, n int) string {
	t.Helper()
	var got strings.Builder
	for i := 0; i < n; {
		line, err := r.ReadString('\n')
		got.WriteString(line)
		if err != nil {
			t.Fatalf("reading event %d: %v (got %q)", i+1, err, got.String())
		}
		if line == "\n" {
			i++
		}
	}
	return got.String()
}

// eventStream is a handler that sends six events, flushing each, and waits
// after the second for the client to have left.
func eventStream(t *testing.T, execs *atomic.Int64, clientGone <-chan struct{}, failures chan<- error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		execs.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusCreated)
		rc := http.NewResponseController(w)
		for i := 1; i <= 6; i++ {
			if _, err := fmt.Fprintf(w, "data: %d\n\n", i); err != nil {
				failures <- fmt.Errorf("write of event %d: %w", i, err)
			}
			if err := rc.Flush(); err != nil {
				failures <- fmt.Errorf("flush of event %d: %w", i, err)
			}
			if i == 2 {
				hold(t, clientGone)
			}
		}
		failures <- r.Context().Err()
	}
}

func allEvents(n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "data: %d\n\n", i)
	}
	return b.String()
}

// 3. An event stream whose client reads the first events and leaves: the
// handler goes on to the end (its writes and flushes do not fail), and the
// retry replays the whole stream.
func TestFaultEventStreamClientLeaves(t *testing.T) {
	t.Parallel()
	var execs atomic.Int64
	failures := make(chan error, 20)
	log := newEventLog()
	mw, _ := newMiddleware(t, &idemhttp.Config{Hooks: []idem.Hook{log}})
	gone := make(chan struct{})
	srv := startServer(t, watchClient(mw.Handler(eventStream(t, &execs, gone, failures)), "first", gone))

	resp, err := newClient(t).Do(newRequest(t, http.MethodPost, srv.URL+"/stream", "k3", body1, reqID("first")))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if got := readEvents(t, bufio.NewReader(resp.Body), 2); got != allEvents(2) {
		t.Fatalf("first events %q", got)
	}
	resp.Body.Close() // the client leaves mid-stream

	if err := recv(t, failures, "the handler to finish"); err != nil {
		t.Fatalf("the handler saw a failure after its client left: %v", err)
	}
	if ev := log.await(t, "first"); ev.Outcome != idem.Processed || ev.Status != http.StatusCreated {
		t.Fatalf("event %+v", ev)
	}
	a := send(t, newClient(t), http.MethodPost, srv.URL+"/stream", "k3", body1)
	wantReplay(t, a, answer{status: http.StatusCreated, body: allEvents(6)})
	if ct := a.header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("replayed Content-Type %q", ct)
	}
	if n := execs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1", n)
	}
}

// blockingClaims is a store whose Claim, once armed, waits until its
// context ends and then claims anyway, as a store that finished the claim
// just as the caller gave up would.
func blockingClaims(armed *atomic.Bool, blocked chan<- struct{}) *hookStore {
	st := &hookStore{MemoryStore: idemtest.NewMemoryStore(nil)}
	st.claim = func(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
		if armed.CompareAndSwap(true, false) {
			blocked <- struct{}{}
			<-ctx.Done()
			return st.MemoryStore.Claim(context.WithoutCancel(ctx), req)
		}
		return st.MemoryStore.Claim(ctx, req)
	}
	return st
}

// 4. A client that leaves before the handler starts stops everything for
// itself: nothing runs for it, the key is not left claimed by it, and its
// event says canceled (499).
func TestFaultClientLeavesBeforeHandler(t *testing.T) {
	t.Parallel()
	t.Run("claim pending", func(t *testing.T) {
		t.Parallel()
		var (
			armed atomic.Bool
			execs atomic.Int64
		)
		blocked := make(chan struct{}, 1)
		st := blockingClaims(&armed, blocked)
		armed.Store(true)
		log := newEventLog()
		mw := newHookMiddleware(t, st, &idemhttp.Config{Hooks: []idem.Hook{log}})
		srv := startServer(t, mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			execs.Add(1)
			w.WriteHeader(http.StatusCreated)
		})))
		relay := startRelay(t, srv.Listener.Addr().String())
		relay.SetNext(1, cutClient)

		if _, err := exchange(newClient(t), newRequest(t, http.MethodPost, relay.URL()+"/pay", "k4", body1, reqID("gone"))); err == nil {
			t.Fatal("the cut client got an answer")
		}
		recv(t, blocked, "the claim to block")
		ev := log.await(t, "gone")
		if ev.Outcome != idem.Canceled || ev.Status != 499 {
			t.Fatalf("event %+v, want canceled 499", ev)
		}
		if n := execs.Load(); n != 0 {
			t.Fatalf("the handler ran %d times for a client that left before it started", n)
		}
		// The claim it got after leaving was released: the next request
		// runs the handler rather than waiting for a lease to expire.
		if a := send(t, newClient(t), http.MethodPost, srv.URL+"/pay", "k4", body1, reqID("next")); a.status != http.StatusCreated ||
			a.header.Get(idemhttp.ReplayedHeader) != "" {
			t.Fatalf("next request: %v", a)
		}
		if n := execs.Load(); n != 1 {
			t.Fatalf("handler runs %d, want 1", n)
		}
	})
	t.Run("waiting on an in-flight key", func(t *testing.T) {
		t.Parallel()
		var execs atomic.Int64
		started := make(chan struct{}, 1)
		release := make(chan struct{})
		log := newEventLog()
		mw, _ := newMiddleware(t, &idemhttp.Config{Wait: patience, Hooks: []idem.Hook{log}})
		srv := startServer(t, mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := execs.Add(1)
			started <- struct{}{}
			hold(t, release)
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, "run %d", n)
		})))
		relay := startRelay(t, srv.Listener.Addr().String())

		first := make(chan answer, 1)
		go func() {
			a, _ := exchange(newClient(t), newRequest(t, http.MethodPost, srv.URL+"/pay", "k5", body1, reqID("first")))
			first <- a
		}()
		recv(t, started, "the first request's handler to start")
		relay.SetNext(1, cutClient)
		if _, err := exchange(newClient(t), newRequest(t, http.MethodPost, relay.URL()+"/pay", "k5", body1, reqID("waiter"))); err == nil {
			t.Fatal("the cut client got an answer")
		}
		ev := log.await(t, "waiter")
		if ev.Outcome != idem.Canceled || ev.Status != 499 {
			t.Fatalf("waiter's event %+v, want canceled 499", ev)
		}
		close(release)
		if a := recv(t, first, "the first answer"); a.status != http.StatusCreated || a.body != "run 1" {
			t.Fatalf("first: %v", a)
		}
		if n := execs.Load(); n != 1 {
			t.Fatalf("handler runs %d, want 1", n)
		}
	})
}

// 5. CancelOnDisconnect restores plain net/http: the handler's context
// ends when its client goes away.
func TestFaultCancelOnDisconnect(t *testing.T) {
	t.Parallel()
	ctxErr := make(chan error, 1)
	started := make(chan struct{}, 1)
	mw, _ := newMiddleware(t, &idemhttp.Config{CancelOnDisconnect: true})
	srv := startServer(t, mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		select {
		case <-r.Context().Done():
		case <-time.After(patience):
		}
		ctxErr <- r.Context().Err()
	})))
	cutAfterStart(t, srv.Listener.Addr().String(), newRequest(t, http.MethodPost, srv.URL+"/pay", "k6", body1), started)
	if err := recv(t, ctxErr, "the handler to finish"); !errors.Is(err, context.Canceled) {
		t.Fatalf("handler's context: %v, want canceled when the client left", err)
	}
}

// 6. HandlerTimeout bounds the handler's context.
func TestFaultHandlerTimeout(t *testing.T) {
	t.Parallel()
	type seen struct {
		err         error
		hasDeadline bool
	}
	got := make(chan seen, 1)
	mw, _ := newMiddleware(t, &idemhttp.Config{HandlerTimeout: 200 * time.Millisecond})
	srv := startServer(t, mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, ok := r.Context().Deadline()
		select {
		case <-r.Context().Done():
		case <-time.After(patience):
		}
		got <- seen{r.Context().Err(), ok}
		w.WriteHeader(http.StatusGatewayTimeout)
	})))
	a := send(t, newClient(t), http.MethodPost, srv.URL+"/pay", "k7", body1)
	s := recv(t, got, "the handler")
	if !s.hasDeadline || !errors.Is(s.err, context.DeadlineExceeded) {
		t.Fatalf("handler's context: deadline %v, err %v; want it bounded by HandlerTimeout", s.hasDeadline, s.err)
	}
	if a.status != http.StatusGatewayTimeout {
		t.Fatalf("answer %v", a)
	}
}

// 7. A response whose record cannot be written is still sent, marked
// Idempotent-Recorded: false, and the key stays claimed (409, not a second
// run); a transient store failure is retried and ends recorded.
func TestFaultRecordFailure(t *testing.T) {
	t.Parallel()
	newServer := func(t *testing.T, complete func(st *hookStore) func(context.Context, idem.CompleteRequest) error) (*httptest.Server, *eventLog, *atomic.Int64) {
		var execs atomic.Int64
		st := &hookStore{MemoryStore: idemtest.NewMemoryStore(nil)}
		st.complete = complete(st)
		log := newEventLog()
		mw := newHookMiddleware(t, st, &idemhttp.Config{Hooks: []idem.Hook{log}})
		srv := startServer(t, mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := execs.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"charge":%d}`, n)
		})))
		return srv, log, &execs
	}
	t.Run("permanent", func(t *testing.T) {
		t.Parallel()
		diskFull := errors.New("disk full")
		srv, log, execs := newServer(t, func(*hookStore) func(context.Context, idem.CompleteRequest) error {
			return func(context.Context, idem.CompleteRequest) error { return diskFull }
		})
		a := send(t, newClient(t), http.MethodPost, srv.URL+"/pay", "k8", body1, reqID("first"))
		if a.status != http.StatusCreated || a.body != `{"charge":1}` || a.header.Get(idemhttp.RecordedHeader) != "false" {
			t.Fatalf("answer %v, want the handler's 201 with %s: false", a, idemhttp.RecordedHeader)
		}
		ev := log.await(t, "first")
		if ev.Outcome != idem.NotRecorded || !errors.Is(ev.Err, idem.ErrNotRecorded) || !errors.Is(ev.Err, diskFull) {
			t.Fatalf("event %+v", ev)
		}
		wantInFlight(t, send(t, newClient(t), http.MethodPost, srv.URL+"/pay", "k8", body1))
		if n := execs.Load(); n != 1 {
			t.Fatalf("handler runs %d, want 1", n)
		}
	})
	// A streamed response is already out when its record fails: the
	// marker comes as a trailer.
	t.Run("streamed", func(t *testing.T) {
		t.Parallel()
		st := &hookStore{MemoryStore: idemtest.NewMemoryStore(nil)}
		st.complete = func(context.Context, idem.CompleteRequest) error { return errors.New("disk full") }
		mw := newHookMiddleware(t, st, &idemhttp.Config{})
		srv := startServer(t, mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusCreated)
			for i := range 3 {
				fmt.Fprintf(w, "data: %d\n\n", i)
				_ = http.NewResponseController(w).Flush()
			}
		})))
		resp, err := newClient(t).Do(newRequest(t, http.MethodPost, srv.URL+"/pay", "k10", body1))
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusCreated || strings.Count(string(b), "data:") != 3 {
			t.Fatalf("stream: %d %q %v", resp.StatusCode, b, err)
		}
		if got := resp.Trailer.Get(idemhttp.RecordedHeader); got != "false" {
			t.Fatalf("trailer %s = %q, want false (trailers %v)", idemhttp.RecordedHeader, got, resp.Trailer)
		}
	})
	t.Run("transient", func(t *testing.T) {
		t.Parallel()
		var attempts atomic.Int64
		srv, log, execs := newServer(t, func(st *hookStore) func(context.Context, idem.CompleteRequest) error {
			return func(ctx context.Context, req idem.CompleteRequest) error {
				if attempts.Add(1) <= 2 {
					return idem.Retryable(errors.New("connection reset"))
				}
				return st.MemoryStore.Complete(ctx, req)
			}
		})
		a := send(t, newClient(t), http.MethodPost, srv.URL+"/pay", "k9", body1, reqID("first"))
		if a.status != http.StatusCreated || a.header.Get(idemhttp.RecordedHeader) != "" {
			t.Fatalf("answer %v, want 201 without %s", a, idemhttp.RecordedHeader)
		}
		if ev := log.await(t, "first"); ev.Outcome != idem.Processed || ev.Err != nil {
			t.Fatalf("event %+v", ev)
		}
		if n := attempts.Load(); n != 3 {
			t.Fatalf("Complete attempts %d, want 3", n)
		}
		wantReplay(t, send(t, newClient(t), http.MethodPost, srv.URL+"/pay", "k9", body1), a)
		if n := execs.Load(); n != 1 {
			t.Fatalf("handler runs %d, want 1", n)
		}
	})
}

// 8. A lease lost while the handler runs does not cancel it; its answer
// says it was not recorded.
func TestFaultLeaseLost(t *testing.T) {
	t.Parallel()
	t.Run("record deleted", func(t *testing.T) {
		t.Parallel()
		st := &hookStore{MemoryStore: idemtest.NewMemoryStore(nil)}
		started := make(chan struct{}, 1)
		release := make(chan struct{})
		ctxErr := make(chan error, 1)
		log := newEventLog()
		mw := newHookMiddleware(t, st, &idemhttp.Config{Hooks: []idem.Hook{log}})
		srv := startServer(t, mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			started <- struct{}{}
			hold(t, release)
			ctxErr <- r.Context().Err()
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "done")
		})))
		first := make(chan answer, 1)
		go func() {
			a, _ := exchange(newClient(t), newRequest(t, http.MethodPost, srv.URL+"/pay", "k10", body1, reqID("first")))
			first <- a
		}()
		recv(t, started, "the handler to start")
		// An operator deletes the record while the handler runs.
		if err := st.Delete(context.Background(), st.lastScope(), "k10"); err != nil {
			t.Fatal(err)
		}
		close(release)
		if err := recv(t, ctxErr, "the handler to finish"); err != nil {
			t.Fatalf("handler's context: %v", err)
		}
		a := recv(t, first, "the first answer")
		if a.status != http.StatusCreated || a.body != "done" || a.header.Get(idemhttp.RecordedHeader) != "false" {
			t.Fatalf("answer %v, want 201 with %s: false", a, idemhttp.RecordedHeader)
		}
		if ev := log.await(t, "first"); ev.Outcome != idem.NotRecorded || !errors.Is(ev.Err, idem.ErrLeaseLost) {
			t.Fatalf("event %+v", ev)
		}
	})
	// The lease expires (a manual clock) and another request takes over
	// while the first handler still runs.
	takeover := func(t *testing.T, cancelOnDisconnect, guardHook bool) {
		clock := idemtest.NewClock(time.Unix(1_700_000_000, 0))
		st := &hookStore{MemoryStore: idemtest.NewMemoryStore(&idemtest.MemoryOptions{Now: clock.Now})}
		var (
			// gate, held while the test moves the clock and takes over,
			// keeps the first request's heartbeat from extending its
			// expired lease meanwhile.
			gate       sync.Mutex
			firstToken atomic.Int64
			lost       = make(chan int64, 10)
		)
		st.extend = func(ctx context.Context, scope, key string, token int64, lease time.Duration) (time.Time, error) {
			if token == firstToken.Load() {
				gate.Lock()
				defer gate.Unlock()
			}
			exp, err := st.MemoryStore.Extend(context.WithoutCancel(ctx), scope, key, token, lease)
			if errors.Is(err, idem.ErrLeaseLost) {
				lost <- token
			}
			return exp, err
		}
		var execs atomic.Int64
		started := make(chan int64, 2)
		release := make(chan struct{})
		ctxErr := make(chan error, 1)
		log := newEventLog()
		hooks := []idem.Hook{log}
		if guardHook {
			// A Guard start hook's context reaches the handler; the lease's
			// cancellation must not come with it.
			hooks = append(hooks, &recordingHook{name: "guard"})
		}
		mw := newHookMiddleware(t, st, &idemhttp.Config{Lease: 300 * time.Millisecond, Hooks: hooks,
			CancelOnDisconnect: cancelOnDisconnect})
		srv := startServer(t, mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if guardHook && r.Context().Value(hookKey{"guard", "do"}) == nil {
				t.Error("the handler's context lacks what the Guard's start hook added")
			}
			n := execs.Add(1)
			started <- n
			if n == 1 {
				if cancelOnDisconnect {
					select {
					case <-r.Context().Done():
					case <-time.After(patience):
					}
					ctxErr <- context.Cause(r.Context())
				} else {
					hold(t, release)
					ctxErr <- r.Context().Err()
				}
			}
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, "run %d", n)
		})))
		first := make(chan answer, 1)
		go func() {
			a, _ := exchange(newClient(t), newRequest(t, http.MethodPost, srv.URL+"/pay", "k11", body1, reqID("first")))
			first <- a
		}()
		recv(t, started, "the first handler to start")
		firstToken.Store(st.claimed()[0].Token)
		second := func() answer {
			gate.Lock()
			defer gate.Unlock()      // also if send fails the test
			clock.Advance(time.Hour) // the first lease has expired
			return send(t, newClient(t), http.MethodPost, srv.URL+"/pay", "k11", body1, reqID("second"))
		}()
		if second.status != http.StatusCreated || second.body != "run 2" {
			t.Fatalf("takeover: %v", second)
		}
		claims := st.claimed()
		if len(claims) != 2 || !claims[1].Takeover {
			t.Fatalf("claims %+v, want the second to be a takeover", claims)
		}
		if tok := recv(t, lost, "the first heartbeat to find its lease lost"); tok != claims[0].Token {
			t.Fatalf("lease lost for token %d, want %d", tok, claims[0].Token)
		}
		if cancelOnDisconnect {
			if err := recv(t, ctxErr, "the first handler"); !errors.Is(err, idem.ErrLeaseLost) {
				t.Fatalf("with CancelOnDisconnect the handler's context ends with the lease: %v", err)
			}
		} else {
			// The heartbeat cancels the lease's context right after the
			// Extend above returns; leave it the time to, so that a handler
			// running on that context would see it.
			time.Sleep(50 * time.Millisecond)
			close(release)
			if err := recv(t, ctxErr, "the first handler"); err != nil {
				t.Fatalf("a lost lease cancelled the running handler: %v", err)
			}
		}
		a := recv(t, first, "the first answer")
		if a.status != http.StatusCreated || a.body != "run 1" || a.header.Get(idemhttp.RecordedHeader) != "false" {
			t.Fatalf("first answer %v, want its own 201 marked %s: false", a, idemhttp.RecordedHeader)
		}
		if ev := log.await(t, "first"); ev.Outcome != idem.NotRecorded || !errors.Is(ev.Err, idem.ErrLeaseLost) {
			t.Fatalf("first event %+v", ev)
		}
		// What is recorded is the takeover's answer.
		wantReplay(t, send(t, newClient(t), http.MethodPost, srv.URL+"/pay", "k11", body1), second)
	}
	t.Run("takeover", func(t *testing.T) { t.Parallel(); takeover(t, false, false) })
	t.Run("takeover with CancelOnDisconnect", func(t *testing.T) { t.Parallel(); takeover(t, true, false) })
	t.Run("takeover with a Guard start hook", func(t *testing.T) { t.Parallel(); takeover(t, false, true) })
	t.Run("takeover with CancelOnDisconnect and a Guard start hook", func(t *testing.T) { t.Parallel(); takeover(t, true, true) })
}

// 9. Methods match whatever their case and are scoped and fingerprinted as
// their upper-case form: POST, post and Post with one key are one request.
func TestFaultMethodCase(t *testing.T) {
	t.Parallel()
	var execs atomic.Int64
	methods := make(chan string, 10)
	mw, st := newMiddleware(t, nil)
	srv := startServer(t, mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		methods <- r.Method
		if r.Header.Get("Idempotency-Key") != "" {
			execs.Add(1)
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "created by %s", r.Method)
	})))
	c := newClient(t)
	first := send(t, c, "post", srv.URL+"/pay", "k12", body1)
	if first.status != http.StatusCreated || first.body != "created by post" {
		t.Fatalf("post: %v (the method did not reach the server as sent?)", first)
	}
	for _, m := range []string{"POST", "Post", "pOsT"} {
		wantReplay(t, send(t, c, m, srv.URL+"/pay", "k12", `{ "amount" : 100 }`), first)
	}
	if n := execs.Load(); n != 1 {
		t.Fatalf("handler runs %d, want 1", n)
	}
	// Lower-case patch is covered too; get is not.
	if a := send(t, c, "patch", srv.URL+"/pay", "k13", body1); a.status != http.StatusCreated {
		t.Fatalf("patch: %v", a)
	}
	wantReplay(t, send(t, c, "PATCH", srv.URL+"/pay", "k13", body1), answer{status: http.StatusCreated, body: "created by patch"})
	claims := st.claims.Load()
	if a := send(t, c, "get", srv.URL+"/pay", "k14", ""); a.status != http.StatusCreated || st.claims.Load() != claims {
		t.Fatalf("get: %v, claims %d→%d: a method that is not covered reached the store", a, claims, st.claims.Load())
	}
	// Check agrees: the same scope and fingerprint.
	call := func(method string) idem.Call {
		c, err := mw.Check(newRequest(t, method, "http://x/pay", "k", body1))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	if a, b := call("post"), call("POST"); a != b || !strings.Contains(a.Scope, " POST ") {
		t.Fatalf("post %+v, POST %+v", a, b)
	}
}

// 10. A repeated principal header or Authorization cannot be scoped: 400
// before the store is touched.
func TestFaultRepeatedScopeHeader(t *testing.T) {
	t.Parallel()
	var execs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { execs.Add(1) })
	byHeader, st1 := newMiddleware(t, &idemhttp.Config{Principal: idemhttp.PrincipalFromHeader("X-Client-Id")})
	byAuth, st2 := newMiddleware(t, &idemhttp.Config{Principal: idemhttp.PrincipalFromAuthorization()})
	srv1 := startServer(t, byHeader.Handler(h))
	srv2 := startServer(t, byAuth.Handler(h))
	c := newClient(t)

	a := send(t, c, http.MethodPost, srv1.URL+"/pay", "k", body1, withHeader("X-Client-Id", "alice"), withHeader("X-Client-Id", "mallory"))
	wantProblemAnswer(t, a, http.StatusBadRequest, idemhttp.TypeScopeMissing)
	a = send(t, c, http.MethodPost, srv2.URL+"/pay", "k", body1, withHeader("Authorization", "Bearer A"), withHeader("Authorization", "Bearer B"))
	wantProblemAnswer(t, a, http.StatusBadRequest, idemhttp.TypeScopeMissing)
	if execs.Load() != 0 || st1.claims.Load() != 0 || st2.claims.Load() != 0 {
		t.Fatalf("handler runs %d, claims %d and %d: a request that cannot be scoped went on", execs.Load(), st1.claims.Load(), st2.claims.Load())
	}
	// One value is fine.
	if a := send(t, c, http.MethodPost, srv1.URL+"/pay", "k", body1, withHeader("X-Client-Id", "alice")); a.status != http.StatusOK {
		t.Fatalf("one principal header: %v", a)
	}
	if a := send(t, c, http.MethodPost, srv2.URL+"/pay", "k", body1, withHeader("Authorization", "Bearer A")); a.status != http.StatusOK {
		t.Fatalf("one Authorization: %v", a)
	}
}

func gzipped(t testing.TB, s string) []byte {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	if _, err := io.WriteString(zw, s); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func deflated(t testing.TB, s string) []byte {
	var b bytes.Buffer
	zw := zlib.NewWriter(&b)
	if _, err := io.WriteString(zw, s); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func withEncoding(enc string) reqOpt {
	return func(r *http.Request) { r.Header.Set("Content-Encoding", enc) }
}

// 15. Compressed bodies are fingerprinted decoded, within MaxBodyBytes.
func TestFaultContentEncoding(t *testing.T) {
	t.Parallel()
	var execs atomic.Int64
	mw, st := newMiddleware(t, &idemhttp.Config{MaxBodyBytes: 4096})
	srv := startServer(t, mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := execs.Add(1)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "run %d", n)
	})))
	c := newClient(t)
	url := srv.URL + "/pay"

	first := send(t, c, http.MethodPost, url, "gz", string(gzipped(t, `{"a":1,"b":[1,2]}`)), withEncoding("gzip"))
	if first.status != http.StatusCreated {
		t.Fatalf("gzip: %v", first)
	}
	wantReplay(t, send(t, c, http.MethodPost, url, "gz", `{"b":[1,2],"a":1}`), first)
	wantReplay(t, send(t, c, http.MethodPost, url, "gz", string(deflated(t, `{ "b":[1,2], "a":1 }`)), withEncoding("deflate")), first)
	wantReplay(t, send(t, c, http.MethodPost, url, "gz", string(gzipped(t, `{"a":1,"b":[1,2]}`)), withEncoding("x-gzip")), first)
	wantProblemAnswer(t, send(t, c, http.MethodPost, url, "gz", string(gzipped(t, `{"a":2,"b":[1,2]}`)), withEncoding("gzip")),
		http.StatusUnprocessableEntity, idemhttp.TypeKeyReused)

	// deflate first, plain replays.
	d := send(t, c, http.MethodPost, url, "df", string(deflated(t, `{"x":"y"}`)), withEncoding("deflate"))
	if d.status != http.StatusCreated {
		t.Fatalf("deflate: %v", d)
	}
	wantReplay(t, send(t, c, http.MethodPost, url, "df", `{"x":"y"}`), d)

	claims := st.claims.Load()
	// A bomb: small on the wire, far over MaxBodyBytes decoded.
	bomb := gzipped(t, strings.Repeat("\x00", 1<<20))
	if len(bomb) > 4096 {
		t.Fatalf("the bomb is %d bytes compressed", len(bomb))
	}
	wantProblemAnswer(t, send(t, c, http.MethodPost, url, "bomb", string(bomb), withEncoding("gzip")),
		http.StatusRequestEntityTooLarge, idemhttp.TypeBodyTooLarge)
	wantProblemAnswer(t, send(t, c, http.MethodPost, url, "zbomb", string(deflated(t, strings.Repeat("\x00", 1<<20))), withEncoding("deflate")),
		http.StatusRequestEntityTooLarge, idemhttp.TypeBodyTooLarge)
	// Corrupt or truncated streams.
	wantProblemAnswer(t, send(t, c, http.MethodPost, url, "bad1", "not gzip at all", withEncoding("gzip")),
		http.StatusBadRequest, idemhttp.TypeBodyInvalid)
	gz := gzipped(t, `{"a":1,"b":[1,2]}`)
	wantProblemAnswer(t, send(t, c, http.MethodPost, url, "bad2", string(gz[:len(gz)-6]), withEncoding("gzip")),
		http.StatusBadRequest, idemhttp.TypeBodyInvalid)
	wantProblemAnswer(t, send(t, c, http.MethodPost, url, "bad3", "not deflate", withEncoding("deflate")),
		http.StatusBadRequest, idemhttp.TypeBodyInvalid)
	if st.claims.Load() != claims {
		t.Fatal("a body that could not be decoded reached the store")
	}

	// An encoding idem does not decode is fingerprinted as it is.
	br := send(t, c, http.MethodPost, url, "br", "\x1b\x02\x00opaque", withEncoding("br"))
	if br.status != http.StatusCreated {
		t.Fatalf("br: %v", br)
	}
	wantReplay(t, send(t, c, http.MethodPost, url, "br", "\x1b\x02\x00opaque", withEncoding("br")), br)
	wantProblemAnswer(t, send(t, c, http.MethodPost, url, "br", "\x1b\x02\x00other", withEncoding("br")),
		http.StatusUnprocessableEntity, idemhttp.TypeKeyReused)
	if n := execs.Load(); n != 3 {
		t.Fatalf("handler runs %d, want 3 (gz, df, br)", n)
	}
}

// rawExchange writes head (a request without its body) on a new connection
// to addr and reads the first response.
func rawExchange(t *testing.T, addr, head string) (*http.Response, []byte, net.Conn) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(patience))
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading the response: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("reading the response body: %v", err)
	}
	return resp, b, conn
}

// 16. A declared Content-Length over MaxBodyBytes is refused at once: the
// client gets 413 without sending its body.
func TestFaultDeclaredBodyTooLarge(t *testing.T) {
	t.Parallel()
	var execs atomic.Int64
	mw, st := newMiddleware(t, &idemhttp.Config{MaxBodyBytes: 1024})
	srv := startServer(t, mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { execs.Add(1) })))
	for _, expect := range []string{"", "Expect: 100-continue\r\n"} {
		resp, b, _ := rawExchange(t, srv.Listener.Addr().String(), "POST /upload HTTP/1.1\r\nHost: x\r\nX-User: alice\r\n"+
			"Idempotency-Key: big\r\nContent-Type: application/octet-stream\r\nContent-Length: 10485760\r\n"+expect+"\r\n")
		a := answer{resp.StatusCode, resp.Header, string(b)}
		wantProblemAnswer(t, a, http.StatusRequestEntityTooLarge, idemhttp.TypeBodyTooLarge)
		if !resp.Close || a.header.Get("Idempotency-Key") != "big" {
			t.Fatalf("413 must close the connection (its body is unread) and echo the key: %v", a)
		}
	}
	if execs.Load() != 0 || st.claims.Load() != 0 {
		t.Fatal("an oversized request ran or reached the store")
	}
}

// 18. Every answer to a request with a valid key echoes the key as sent;
// Request-Id and X-Request-Id are replayed, Set-Cookie never.
func TestFaultEchoAndReplayedHeaders(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	mw, st := newMiddleware(t, &idemhttp.Config{MaxBodyBytes: 100})
	srv := startServer(t, mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/block":
			started <- struct{}{}
			hold(t, release)
		case "/fail":
			w.WriteHeader(http.StatusBadGateway)
			return
		case "/stream":
			io.WriteString(w, "chunk")
			w.(http.Flusher).Flush()
			return
		}
		h := w.Header()
		h.Set("Request-Id", "rq-1")
		h.Set("X-Request-Id", "xrq-1")
		h.Set("Set-Cookie", "session=secret")
		h.Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"ok":true}`)
	})))
	c := newClient(t)
	url := srv.URL
	const key = `"abc-1"` // an sf-string: echoed with its quotes
	echoed := func(what string, a answer) {
		t.Helper()
		if got := a.header.Values("Idempotency-Key"); len(got) != 1 || got[0] != key {
			t.Errorf("%s: Idempotency-Key %q, want [%s]: %v", what, got, key, a)
		}
	}
	first := send(t, c, http.MethodPost, url+"/pay", key, body1)
	echoed("executed", first)
	if first.header.Get("Set-Cookie") == "" {
		t.Errorf("the first caller did not get the handler's Set-Cookie: %v", first)
	}
	replay := send(t, c, http.MethodPost, url+"/pay", key, body1)
	wantReplay(t, replay, first)
	echoed("replay", replay)
	if replay.header.Get("Request-Id") != "rq-1" || replay.header.Get("X-Request-Id") != "xrq-1" || replay.header.Get("Set-Cookie") != "" {
		t.Errorf("replayed headers %v", replay.header)
	}
	// The same key as a bare token is the same key, echoed as sent.
	if a := send(t, c, http.MethodPost, url+"/pay", "abc-1", body1); a.header.Get("Idempotency-Key") != "abc-1" || a.header.Get(idemhttp.ReplayedHeader) != "true" {
		t.Errorf("bare token: %v", a)
	}
	echoed("mismatch", send(t, c, http.MethodPost, url+"/pay", key, `{"amount":1}`))
	echoed("streamed", send(t, c, http.MethodPost, url+"/stream", key, body1))
	echoed("released 5xx", send(t, c, http.MethodPost, url+"/fail", key, body1))
	echoed("no principal", send(t, c, http.MethodPost, url+"/pay", key, body1, func(r *http.Request) { r.Header.Del("X-User") }))
	echoed("body too large", send(t, c, http.MethodPost, url+"/pay", key, strings.Repeat(" ", 200)+body1))
	echoed("invalid JSON", send(t, c, http.MethodPost, url+"/pay", key, `{"amount":`))

	inFlight := make(chan answer, 1)
	go func() { a, _ := exchange(c, newRequest(t, http.MethodPost, url+"/block", key, body1)); inFlight <- a }()
	recv(t, started, "the blocking handler")
	a := send(t, c, http.MethodPost, url+"/block", key, body1)
	wantInFlight(t, a)
	echoed("in flight", a)
	close(release)
	echoed("blocked", recv(t, inFlight, "the blocked answer"))

	st.fail.Store(true)
	a = send(t, c, http.MethodPost, url+"/other", key, body1)
	wantProblemAnswer(t, a, http.StatusServiceUnavailable, idemhttp.TypeStoreUnavailable)
	echoed("store down", a)
	st.fail.Store(false)

	// An invalid key is not echoed.
	if a := send(t, c, http.MethodPost, url+"/pay", `"unterminated`, body1); a.status != http.StatusBadRequest || a.header.Get("Idempotency-Key") != "" {
		t.Errorf("invalid key: %v", a)
	}
}

// stripeErr is Stripe's error body, every member required.
type stripeErr struct {
	Error map[string]string `json:"error"`
}

func wantStripe(t *testing.T, a answer, status int, typ, code string) {
	t.Helper()
	if a.status != status || a.header.Get("Content-Type") != "application/json" {
		t.Fatalf("want %d application/json, got %v", status, a)
	}
	var e stripeErr
	if err := json.Unmarshal([]byte(a.body), &e); err != nil {
		t.Fatalf("body %q: %v", a.body, err)
	}
	if len(e.Error) != 4 || e.Error["type"] != typ || e.Error["code"] != code || e.Error["message"] == "" ||
		!strings.HasPrefix(e.Error["doc_url"], "https://idem-go.dev/problems/") {
		t.Fatalf("error %v, want type %s code %s and a message and doc_url", e.Error, typ, code)
	}
}

// 19. FormatStripe writes Stripe's error shape with Stripe's statuses.
func TestFaultStripeErrors(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	mw, st := newMiddleware(t, &idemhttp.Config{ErrorFormat: idemhttp.FormatStripe, RequireKey: true})
	srv := startServer(t, mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/block" {
			started <- struct{}{}
			hold(t, release)
		}
		w.WriteHeader(http.StatusCreated)
	})))
	c := newClient(t)
	wantStripe(t, send(t, c, http.MethodPost, srv.URL+"/pay", "", body1), http.StatusBadRequest, "invalid_request_error", "idempotency_key_missing")
	send(t, c, http.MethodPost, srv.URL+"/pay", "k", body1)
	wantStripe(t, send(t, c, http.MethodPost, srv.URL+"/pay", "k", `{"amount":2}`), http.StatusBadRequest, "idempotency_error", "idempotency_key_reused")

	done := make(chan answer, 1)
	go func() { a, _ := exchange(c, newRequest(t, http.MethodPost, srv.URL+"/block", "b", body1)); done <- a }()
	recv(t, started, "the blocking handler")
	a := send(t, c, http.MethodPost, srv.URL+"/block", "b", body1)
	wantStripe(t, a, http.StatusConflict, "idempotency_error", "idempotency_key_in_use")
	if a.header.Get("Stripe-Should-Retry") != "true" || a.header.Get("Retry-After") == "" {
		t.Fatalf("409: %v", a.header)
	}
	close(release)
	recv(t, done, "the blocked answer")

	st.fail.Store(true)
	a = send(t, c, http.MethodPost, srv.URL+"/pay", "s", body1)
	wantStripe(t, a, http.StatusServiceUnavailable, "api_error", "idempotency_store_unavailable")
	if a.header.Get("Stripe-Should-Retry") != "true" {
		t.Fatalf("503: %v", a.header)
	}

	if _, err := idemhttp.New(idemtest.NewMemoryStore(nil), &idemhttp.Config{AllowNonDurable: true, ErrorFormat: "xml"}); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("unknown ErrorFormat: %v", err)
	}
	custom, _ := newMiddleware(t, &idemhttp.Config{ErrorFormat: idemhttp.FormatStripe, RequireKey: true,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, p *idemhttp.Problem) {
			w.WriteHeader(p.Status)
			io.WriteString(w, "custom "+p.Code)
		}})
	srv2 := startServer(t, custom.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	if a := send(t, c, http.MethodPost, srv2.URL+"/pay", "", body1); a.status != http.StatusBadRequest || a.body != "custom idempotency_key_missing" {
		t.Fatalf("custom ErrorHandler: %v", a)
	}
}

// 20. A lease below idem.MinLease is refused; a Guard given 1ns uses
// MinLease instead of panicking.
func TestFaultLeaseValidation(t *testing.T) {
	t.Parallel()
	for _, lease := range []time.Duration{-time.Second, time.Nanosecond, idem.MinLease - 1} {
		_, err := idemhttp.New(idemtest.NewMemoryStore(nil), &idemhttp.Config{AllowNonDurable: true, Lease: lease})
		if !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("Lease %v: %v, want ErrInvalidConfig", lease, err)
		}
	}
	if _, err := idemhttp.New(idemtest.NewMemoryStore(nil), &idemhttp.Config{AllowNonDurable: true, Lease: idem.MinLease}); err != nil {
		t.Errorf("Lease MinLease: %v", err)
	}
	g := idem.NewGuard(idemtest.NewMemoryStore(nil), &idem.GuardConfig{Lease: time.Nanosecond, Logger: slog.New(slog.DiscardHandler)})
	if l := g.Config().Lease; l != idem.MinLease {
		t.Fatalf("Guard lease %v, want MinLease", l)
	}
	res, err := g.Do(context.Background(), idem.Call{Scope: "s", Key: "k"}, func(ctx context.Context, _ idem.Run) ([]byte, error) {
		time.Sleep(2 * idem.MinLease) // a few heartbeats
		return []byte("ok"), ctx.Err()
	})
	if err != nil || string(res.Value) != "ok" {
		t.Fatalf("Do: %q %v", res.Value, err)
	}
}
