// Package hooktest drives idem's real components so that tests of a hook
// implementation (contrib/idemprom, contrib/idemotel) see the events the
// components really report: a consume.Engine over in-memory deliveries, the
// idemhttp middleware under a ServeMux pattern, an inbox.Worker over an
// in-memory backend, a Guard over a MemoryStore, and an outbox.Relay over
// outboxtest.Memory with faults in its marks ([DriveOutbox]). Each takes the hooks
// to install (the Hooks of the component's Config), so every metrics
// module runs the same scenarios and asserts its own series.
// [ReportDelivery], [ReportRun], [ReportRequest] and [ReportDo] report one
// event to a hook directly, start hook then end hook, as the components
// do.
//
// Keys, scopes, principals and URL paths in these scenarios contain
// "secret", so that a test can check that none reaches a metric.
//
// It is for tests only.
package hooktest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/inbox/inboxtest"
	"github.com/idem-go/idem/retry"
)

// Quiet is a logger that discards everything, for the components under
// test.
var Quiet = slog.New(slog.DiscardHandler)

// WantCounts fails t for each series of want that is missing from got or
// has another value. Series of got that want does not name are ignored.
func WantCounts(t testing.TB, got, want map[string]float64) {
	t.Helper()
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
}

// Delivery is a broker delivery in memory that records how the engine
// settled it. Its origin is "orders".
type Delivery struct {
	id    string
	body  []byte
	state consume.State

	mu      sync.Mutex
	settled string
	next    consume.State
}

// NewDelivery returns a first delivery of a message; id "" is a message
// without an id.
func NewDelivery(id, body string) *Delivery {
	return &Delivery{id: id, body: []byte(body)}
}

// ID implements consume.Delivery.
func (d *Delivery) ID() string { return d.id }

// Body implements consume.Delivery.
func (d *Delivery) Body() []byte { return d.body }

// Origin implements consume.Delivery.
func (d *Delivery) Origin() string { return "orders" }

// State implements consume.Delivery.
func (d *Delivery) State() consume.State { return d.state }

// Ack implements consume.Delivery.
func (d *Delivery) Ack(context.Context) error { return d.settle("ack", nil) }

// Requeue implements consume.Delivery.
func (d *Delivery) Requeue(context.Context) error { return d.settle("requeue", nil) }

// Retry implements consume.Delivery, keeping st for the redelivery.
func (d *Delivery) Retry(_ context.Context, _ time.Duration, st consume.State) error {
	return d.settle("retry", &st)
}

// DeadLetter implements consume.Delivery.
func (d *Delivery) DeadLetter(context.Context, consume.DeadLetter) error {
	return d.settle("dead-letter", nil)
}

func (d *Delivery) settle(op string, next *consume.State) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.settled = op
	if next != nil {
		d.next = *next
	}
	return nil
}

// Settled returns how the engine settled the delivery: "ack", "retry",
// "requeue", "dead-letter", or "" when it did not.
func (d *Delivery) Settled() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.settled
}

// redelivery returns the delivery a broker makes after a retry.
func (d *Delivery) redelivery() *Delivery {
	d.mu.Lock()
	defer d.mu.Unlock()
	return &Delivery{id: d.id, body: d.body, state: d.next}
}

// NewEngine returns a consume.Engine named name that reports to hooks and
// runs handler under a Guard over a MemoryStore. It retries after 1ms and
// dead-letters on the third failed attempt.
func NewEngine(t testing.TB, hooks []idem.Hook, name string, handler func(context.Context, idem.Run, consume.Delivery) error) *consume.Engine {
	t.Helper()
	g := idem.NewGuard(idemtest.NewMemoryStore(nil), &idem.GuardConfig{Logger: Quiet})
	e, err := consume.New(consume.GuardProcess(g, handler), &consume.Config{
		Name:   name,
		Retry:  &retry.Policy{Base: time.Millisecond, Cap: time.Millisecond, MaxAttempts: 3, Jitter: retry.NoJitter},
		Hooks:  hooks,
		Logger: Quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// Handle has e handle d and fails t unless the outcome is want.
func Handle(t testing.TB, ctx context.Context, e *consume.Engine, d *Delivery, want idem.Outcome) {
	t.Helper()
	out, err := e.Handle(ctx, d)
	if err != nil || out != want {
		t.Fatalf("delivery %q: %v, %v; want %v", d.id, out, err, want)
	}
}

// redeliver hands e the message (id, body), then again with the state the
// engine retried it with, as a broker would, once for each of wants, and
// fails t unless the outcomes are wants in order.
func redeliver(t testing.TB, ctx context.Context, e *consume.Engine, id, body string, wants ...idem.Outcome) {
	t.Helper()
	d := NewDelivery(id, body)
	for i, want := range wants {
		if i > 0 {
			d = d.redelivery()
		}
		Handle(t, ctx, e, d, want)
	}
}

// DriveConsume runs two engines made by [NewEngine] that report to hooks,
// and hands them deliveries in ctx. Their outcomes are, in order:
//
//	payments  pay-secret-1  processed
//	payments  pay-secret-1  duplicate
//	payments  pay-secret-2  processed
//	payments  (no id)       dead_lettered (missing_id, before the handler)
//	refunds   refund-secret retried  (attempt 1)
//	refunds   refund-secret retried  (attempt 2)
//	refunds   refund-secret dead_lettered (max_attempts, attempt 3)
//
// The payments handler succeeds; the refunds handler fails with the error
// "gateway timeout for customer-secret", a counted failure.
func DriveConsume(t testing.TB, ctx context.Context, hooks []idem.Hook) {
	t.Helper()
	ok := NewEngine(t, hooks, "payments", func(context.Context, idem.Run, consume.Delivery) error { return nil })
	boom := NewEngine(t, hooks, "refunds", func(context.Context, idem.Run, consume.Delivery) error {
		return errors.New("gateway timeout for customer-secret")
	})
	Handle(t, ctx, ok, NewDelivery("pay-secret-1", "a"), idem.Processed)
	Handle(t, ctx, ok, NewDelivery("pay-secret-1", "a"), idem.Duplicate)
	Handle(t, ctx, ok, NewDelivery("pay-secret-2", "b"), idem.Processed)
	Handle(t, ctx, ok, NewDelivery("", "no id"), idem.DeadLettered)
	redeliver(t, ctx, boom, "refund-secret", "r", idem.Retried, idem.Retried, idem.DeadLettered)
}

// Route is the ServeMux pattern under which [ServeIdem] serves.
const Route = "POST /accounts/{account}/payments"

// ServeIdem returns a ServeMux that runs the real idemhttp middleware,
// reporting to hooks, under [Route]. The middleware requires a key and
// takes the principal from X-User; the handler answers 201, or 503 when the
// request has an X-Fail header.
func ServeIdem(t testing.TB, hooks []idem.Hook) *http.ServeMux {
	t.Helper()
	mw, err := idemhttp.New(idemtest.NewMemoryStore(nil), &idemhttp.Config{
		Principal:       idemhttp.PrincipalFromHeader("X-User"),
		RequireKey:      true,
		AllowNonDurable: true,
		Hooks:           hooks,
		Logger:          Quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(Route, mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Fail") != "" {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"ok":true}`)
	})))
	return mux
}

// Post sends h a JSON POST to /accounts/acct-secret-42/payments as user
// alice-secret, with Idempotency-Key key unless key is "", and X-Fail if
// fail, and returns the response status.
func Post(t testing.TB, h http.Handler, key, body string, fail bool) int {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, "/accounts/acct-secret-42/payments", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("X-User", "alice-secret")
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	if fail {
		r.Header.Set("X-Fail", "1")
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code
}

// DriveHTTP sends h, a [ServeIdem] handler, five requests whose outcomes
// are, in order: processed (201), duplicate (201), mismatch (422), rejected
// (400, no key) and released (503).
func DriveHTTP(t testing.TB, h http.Handler) {
	t.Helper()
	for _, c := range []struct {
		key, body string
		fail      bool
		want      int
	}{
		{`"key-secret-1"`, `{"a":1}`, false, http.StatusCreated},
		{`"key-secret-1"`, `{"a":1}`, false, http.StatusCreated}, // replayed
		{`"key-secret-1"`, `{"a":2}`, false, http.StatusUnprocessableEntity},
		{"", `{"a":1}`, false, http.StatusBadRequest},
		{`"key-secret-2"`, `{"a":1}`, true, http.StatusServiceUnavailable}, // released
	} {
		if got := Post(t, h, c.key, c.body, c.fail); got != c.want {
			t.Fatalf("key %s: status %d, want %d", c.key, got, c.want)
		}
	}
}

// DriveInbox reports nine runs to hooks (see [Run]), as an inbox.Worker
// would, each for a message with source orders-secret, id msg-secret and
// ordering key customer-secret:
//
//	order.created  processed  3ms
//	order.created  processed  1ms
//	order.created  retried    1ms (with an error)
//	order.paid     dead_lettered 1ms (idem.DeadMaxAttempts)
//	order.paid     released   (did not run: no duration)
//	order.paid     unknown_outcome 1ms (an outcome idem does not declare)
//	order.shipped  lease_lost (no duration, idem.ErrLeaseLost)
//	spam.1         processed  1ms
//	spam.2         processed  1ms
func DriveInbox(ctx context.Context, hooks []idem.Hook) {
	msg := func(typ string) inbox.Message {
		return inbox.Message{Source: "orders-secret", ID: "msg-secret", Type: typ, OrderingKey: "customer-secret"}
	}
	for _, ev := range []inbox.Event{
		{Message: msg("order.created"), Outcome: idem.Processed, Duration: 3 * time.Millisecond},
		{Message: msg("order.created"), Outcome: idem.Processed, Duration: time.Millisecond},
		{Message: msg("order.created"), Outcome: idem.Retried, Err: errors.New("x"), Duration: time.Millisecond},
		{Message: msg("order.paid"), Outcome: idem.DeadLettered, DeadReason: idem.DeadMaxAttempts, Duration: time.Millisecond},
		{Message: msg("order.paid"), Outcome: idem.Released},
		{Message: msg("order.paid"), Outcome: idem.Outcome("unknown_outcome"), Duration: time.Millisecond},
		{Message: msg("order.shipped"), Outcome: idem.LeaseLost, Err: idem.ErrLeaseLost},
		{Message: msg("spam.1"), Outcome: idem.Processed, Duration: time.Millisecond},
		{Message: msg("spam.2"), Outcome: idem.Processed, Duration: time.Millisecond},
	} {
		for _, h := range hooks {
			ReportRun(ctx, h, ev)
		}
	}
}

// NewWorker returns an inbox.Worker over an in-memory backend that reports
// to hooks. One RunOnce runs six rows (source orders, message ids msg-1
// to msg-6, ordering key customer-secret) whose outcomes are, in order:
//
//	1 order.created    processed
//	2 order.failing    retried       (handler error, first attempt)
//	3 order.permanent  dead_lettered (idem.DeadPermanent)
//	4 order.created    lease_lost    (another worker took the row)
//	5 order.unknown    dead_lettered (idem.DeadNoHandler)
//	6 order.failing    dead_lettered (idem.DeadMaxAttempts: third attempt of three)
func NewWorker(t testing.TB, hooks []idem.Hook) *inbox.Worker[struct{}] {
	t.Helper()
	row := func(id int64, typ string, attempts int) inbox.Row {
		return inbox.Row{ID: id, Source: "orders", MessageID: fmt.Sprintf("msg-%d", id), Type: typ,
			OrderingKey: "customer-secret", Attempts: attempts, Token: 7}
	}
	b := &inboxtest.Memory{
		Rows: []inbox.Row{
			row(1, "order.created", 0), row(2, "order.failing", 0), row(3, "order.permanent", 0),
			row(4, "order.created", 0), row(5, "order.unknown", 0), row(6, "order.failing", 2),
		},
		Lost: map[int64]bool{4: true},
	}
	w, err := inbox.NewWorker[struct{}](b, &inbox.Config{
		Retry:  &retry.Policy{MaxAttempts: 3},
		Logger: Quiet,
		Hooks:  hooks,
	})
	if err != nil {
		t.Fatal(err)
	}
	for typ, h := range map[string]inbox.Handler[struct{}]{
		"order.created": func(context.Context, struct{}, inbox.Message) error { return nil },
		"order.failing": func(context.Context, struct{}, inbox.Message) error { return errors.New("smtp down") },
		"order.permanent": func(context.Context, struct{}, inbox.Message) error {
			return retry.Permanent(errors.New("bad address"))
		},
	} {
		if err := w.Handle(typ, h); err != nil {
			t.Fatal(err)
		}
	}
	return w
}

// Scope is the scope of every [Call].
const Scope = "secret-scope"

// Call returns a Guard call for key under [Scope], fingerprinted by body.
func Call(key, body string) idem.Call {
	return idem.Call{Scope: Scope, Key: key, Fingerprint: idem.FingerprintBytes([]byte(body))}
}

// Charge is a Guard function that succeeds with the result "charged".
func Charge(context.Context, idem.Run) ([]byte, error) { return []byte("charged"), nil }

// NewGuard returns a Guard over store that reports to hooks.
func NewGuard(store idem.Store, hooks []idem.Hook) *idem.Guard {
	return idem.NewGuard(store, &idem.GuardConfig{Hooks: hooks, Logger: Quiet})
}

// DriveGuard makes five calls of g.Do whose outcomes are, in order:
// processed, duplicate, duplicate (keys secret-key-1), mismatch
// (secret-key-1 with another body) and released (secret-key-2). It fails t if Do does not
// return what these outcomes return.
func DriveGuard(t testing.TB, ctx context.Context, g *idem.Guard) {
	t.Helper()
	for range 3 {
		if _, err := g.Do(ctx, Call("secret-key-1", "a"), Charge); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := g.Do(ctx, Call("secret-key-1", "b"), Charge); !errors.Is(err, idem.ErrFingerprintMismatch) {
		t.Fatalf("mismatch = %v", err)
	}
	boom := errors.New("boom")
	if _, err := g.Do(ctx, Call("secret-key-2", "a"), func(context.Context, idem.Run) ([]byte, error) { return nil, boom }); !errors.Is(err, boom) {
		t.Fatalf("failure = %v", err)
	}
}

// ReportConcurrently reports to hooks from goroutines goroutines at once,
// each times, and returns when all are done. Goroutine i reports to
// hook("c<i%16>") under that name (the consumer and the inbox event type;
// the name hook gives a Guard) and the route pattern "POST /r<i%16>": 16
// names, more than a small label cap admits. Each time it reports, each
// lasting 1ms, a delivery retried for an error, a processed inbox run, a
// processed request (201) and a processed Guard call, to whichever of the
// hook interfaces the hook implements.
func ReportConcurrently(goroutines, each int, hook func(name string) idem.Hook) {
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := range goroutines {
		wg.Go(func() {
			name := fmt.Sprintf("c%d", i%16)
			h := hook(name)
			req := httptest.NewRequest(http.MethodPost, "/", nil)
			req.Pattern = fmt.Sprintf("POST /r%d", i%16)
			for range each {
				ReportDo(ctx, h, idem.DoEvent{Scope: "s", Key: "k", Outcome: idem.Processed, Duration: time.Millisecond})
				ReportDelivery(ctx, h, consume.Event{Consumer: name, Outcome: idem.Retried, Err: errors.New("x"), Duration: time.Millisecond})
				ReportRun(ctx, h, inbox.Event{Message: inbox.Message{Type: name}, Outcome: idem.Processed, Duration: time.Millisecond})
				ReportRequest(ctx, h, idemhttp.Event{Request: req, Outcome: idem.Processed, Status: 201, Duration: time.Millisecond})
			}
		})
	}
	wg.Wait()
}

// ReportDelivery reports ev to h as a consume.Engine does, when h implements
// its hooks: the start hook with ev less its outcome and results, then the
// end hook with ev and the context the start hook returned.
func ReportDelivery(ctx context.Context, h idem.Hook, ev consume.Event) {
	if s, ok := h.(consume.DeliveryStartHook); ok {
		ctx = s.OnDeliveryStart(ctx, consume.Event{Consumer: ev.Consumer, ID: ev.ID, Key: ev.Key, Attempt: ev.Attempt})
	}
	if e, ok := h.(consume.DeliveryEndHook); ok {
		e.OnDeliveryEnd(ctx, ev)
	}
}

// ReportRun reports ev to h as an inbox.Worker does, when h implements its
// hooks: the start hook with ev's message, then the end hook with ev and
// the context the start hook returned.
func ReportRun(ctx context.Context, h idem.Hook, ev inbox.Event) {
	if s, ok := h.(inbox.RunStartHook); ok {
		ctx = s.OnRunStart(ctx, inbox.Event{Message: ev.Message})
	}
	if e, ok := h.(inbox.RunEndHook); ok {
		e.OnRunEnd(ctx, ev)
	}
}

// ReportRequest reports ev to h as the idemhttp middleware does, when h
// implements its hooks: the start hook with ev's request, scope hash and
// key, then the end hook with ev and the context the start hook returned
// (ev.Request, if any, carries it).
func ReportRequest(ctx context.Context, h idem.Hook, ev idemhttp.Event) {
	if ev.Request != nil {
		ctx = ev.Request.Context()
	}
	if s, ok := h.(idemhttp.RequestStartHook); ok {
		ctx = s.OnRequestStart(ctx, idemhttp.Event{Request: ev.Request, ScopeHash: ev.ScopeHash, Key: ev.Key})
		if ev.Request != nil {
			ev.Request = ev.Request.WithContext(ctx)
		}
	}
	if e, ok := h.(idemhttp.RequestEndHook); ok {
		e.OnRequestEnd(ctx, ev)
	}
}

// ReportDo reports ev to h as a Guard does, when h implements its hooks: the
// start hook with ev's scope and key, then the end hook with ev and the
// context the start hook returned.
func ReportDo(ctx context.Context, h idem.Hook, ev idem.DoEvent) {
	if s, ok := h.(idem.DoStartHook); ok {
		ctx = s.OnDoStart(ctx, idem.DoEvent{Scope: ev.Scope, Key: ev.Key})
	}
	if e, ok := h.(idem.DoEndHook); ok {
		e.OnDoEnd(ctx, ev)
	}
}
