package idemprom

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/retry"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func newMetrics(t *testing.T, opts *Options) (*Metrics, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := New(reg, opts)
	if err != nil {
		t.Fatal(err)
	}
	return m, reg
}

// series gathers reg and returns, per "name{l=v,...}", a counter's value or
// a histogram's sample count.
func series(t *testing.T, reg prometheus.Gatherer) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, lp := range m.GetLabel() {
				labels = append(labels, lp.GetName()+"="+lp.GetValue())
			}
			sort.Strings(labels)
			k := mf.GetName() + "{" + strings.Join(labels, ",") + "}"
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				out[k] = m.GetCounter().GetValue()
			case dto.MetricType_HISTOGRAM:
				out[k] = float64(m.GetHistogram().GetSampleCount())
			default:
				t.Fatalf("unexpected metric type %v for %s", mf.GetType(), k)
			}
		}
	}
	return out
}

func wantSeries(t *testing.T, got map[string]float64, want map[string]float64) {
	t.Helper()
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
}

// forbidden are label names that would leak per-request data.
var forbidden = map[string]bool{
	"key": true, "idempotency_key": true, "scope": true, "scope_hash": true, "principal": true,
	"path": true, "url": true, "id": true, "message_id": true, "source": true, "ordering_key": true,
}

// noLeaks fails if any label is named like per-request data or any label
// value contains one of the secrets.
func noLeaks(t *testing.T, reg prometheus.Gatherer, secrets ...string) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) == 0 {
		t.Fatal("nothing gathered")
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if forbidden[lp.GetName()] {
					t.Errorf("%s has label %q", mf.GetName(), lp.GetName())
				}
				for _, s := range secrets {
					if strings.Contains(lp.GetValue(), s) {
						t.Errorf("%s label %s=%q leaks %q", mf.GetName(), lp.GetName(), lp.GetValue(), s)
					}
				}
			}
		}
	}
}

func TestNewRejectsNilRegisterer(t *testing.T) {
	t.Parallel()
	if _, err := New(nil, nil); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("got %v", err)
	}
}

func TestNewRejectsNegativeMaxLabelValues(t *testing.T) {
	t.Parallel()
	_, err := New(prometheus.NewRegistry(), &Options{MaxLabelValues: -1})
	if !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("got %v", err)
	}
}

func TestNewRejectsBadNamespace(t *testing.T) {
	t.Parallel()
	for _, ns := range []string{"idem-prod", "1idem", "idem prod", "idém"} {
		if _, err := New(prometheus.NewRegistry(), &Options{Namespace: ns}); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("namespace %q: got %v", ns, err)
		}
	}
	if _, err := New(prometheus.NewRegistry(), &Options{Namespace: "Idem_2"}); err != nil {
		t.Fatal(err)
	}
}

func TestDuplicateRegistration(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	if _, err := New(reg, nil); err != nil {
		t.Fatal(err)
	}
	_, err := New(reg, nil)
	var are prometheus.AlreadyRegisteredError
	if !errors.As(err, &are) || !strings.Contains(err.Error(), `idemprom: metrics with namespace "idem" are already registered`) {
		t.Fatalf("got %v", err)
	}
	// Another namespace is another set of metrics.
	if _, err := New(reg, &Options{Namespace: "idem2"}); err != nil {
		t.Fatal(err)
	}
}

func TestFailedNewLeavesRegistryUnchanged(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	// One of our collectors, registered earlier by other code, after New
	// has registered its first collectors.
	squatter := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idem_inbox_runs_total", Help: "Inbox rows run by an inbox.Worker, by event type and outcome.",
	}, []string{"type", "outcome"})
	reg.MustRegister(squatter)
	if _, err := New(reg, nil); err == nil {
		t.Fatal("New succeeded over a squatted name")
	}
	reg.Unregister(squatter)
	// Had New left its first collectors behind, this would fail.
	if _, err := New(reg, nil); err != nil {
		t.Fatalf("registry not restored: %v", err)
	}
}

func TestInvalidOptionsFailAtRegistration(t *testing.T) {
	t.Parallel()
	for name, opts := range map[string]*Options{
		"const label collision":     {ConstLabels: prometheus.Labels{"outcome": "x"}},
		"const label invalid UTF-8": {ConstLabels: prometheus.Labels{"service": "\xff"}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			reg := prometheus.NewRegistry()
			_, err := New(reg, opts)
			if err == nil || !strings.HasPrefix(err.Error(), "idemprom: registering metrics: ") {
				t.Fatalf("got %v", err)
			}
			if mfs, _ := reg.Gather(); len(mfs) != 0 {
				t.Fatalf("left %d families registered", len(mfs))
			}
		})
	}
}

// fakeDelivery is a broker delivery that records how the engine settled it.
type fakeDelivery struct {
	id      string
	body    []byte
	state   consume.State
	mu      sync.Mutex
	settled string
	next    consume.State
}

func (f *fakeDelivery) ID() string           { return f.id }
func (f *fakeDelivery) Body() []byte         { return f.body }
func (f *fakeDelivery) Origin() string       { return "orders" }
func (f *fakeDelivery) State() consume.State { return f.state }
func (f *fakeDelivery) settle(op string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.settled = op
	return nil
}
func (f *fakeDelivery) Ack(context.Context) error     { return f.settle("ack") }
func (f *fakeDelivery) Requeue(context.Context) error { return f.settle("requeue") }
func (f *fakeDelivery) Retry(_ context.Context, _ time.Duration, st consume.State) error {
	f.next = st
	return f.settle("retry")
}
func (f *fakeDelivery) DeadLetter(context.Context, consume.DeadLetter) error {
	return f.settle("dead-letter")
}

func newEngine(t *testing.T, m *Metrics, name string, handler func(context.Context, idem.Run, consume.Delivery) error) *consume.Engine {
	t.Helper()
	g := idem.NewGuard(idemtest.NewMemoryStore(nil), &idem.GuardConfig{Logger: quiet})
	e, err := consume.New(consume.GuardProcess(g, handler), &consume.Config{
		Name:   name,
		Retry:  &retry.Policy{Base: time.Millisecond, Cap: time.Millisecond, MaxAttempts: 3, Jitter: retry.NoJitter},
		Hooks:  m.ConsumeHooks(),
		Logger: quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func handle(t *testing.T, e *consume.Engine, d *fakeDelivery, want consume.Outcome) {
	t.Helper()
	out, err := e.Handle(context.Background(), d)
	if err != nil || out != want {
		t.Fatalf("delivery %q: %v, %v; want %v", d.id, out, err, want)
	}
}

func TestConsumeHooksWithRealEngine(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t, &Options{ConstLabels: prometheus.Labels{"service": "billing"}})
	ok := newEngine(t, m, "payments", func(context.Context, idem.Run, consume.Delivery) error { return nil })
	boom := newEngine(t, m, "refunds", func(context.Context, idem.Run, consume.Delivery) error {
		return errors.New("gateway timeout")
	})

	handle(t, ok, &fakeDelivery{id: "pay-secret-1", body: []byte("a")}, consume.OutcomeProcessed)
	handle(t, ok, &fakeDelivery{id: "pay-secret-1", body: []byte("a")}, consume.OutcomeDuplicate)
	handle(t, ok, &fakeDelivery{id: "pay-secret-2", body: []byte("b")}, consume.OutcomeProcessed)
	handle(t, ok, &fakeDelivery{body: []byte("no id")}, consume.OutcomeDeadLettered)

	st := consume.State{}
	for _, want := range []consume.Outcome{consume.OutcomeRetried, consume.OutcomeRetried, consume.OutcomeDeadLettered} {
		d := &fakeDelivery{id: "refund-secret", body: []byte("r"), state: st}
		handle(t, boom, d, want)
		st = d.next
	}

	if got := testutil.ToFloat64(m.deliveries.WithLabelValues("payments", "processed")); got != 2 {
		t.Fatalf("payments processed = %v", got)
	}
	if got := testutil.ToFloat64(m.deadLetters.WithLabelValues("refunds", consume.ReasonMaxAttempts)); got != 1 {
		t.Fatalf("refunds max_attempts dead letters = %v", got)
	}
	const header = `
# HELP idem_consumer_deliveries_total Deliveries handled by a consume.Engine, by outcome.
# TYPE idem_consumer_deliveries_total counter
`
	rows := []string{}
	for _, c := range []struct {
		consumer string
		counts   map[string]int
	}{
		{"payments", map[string]int{"processed": 2, "duplicate": 1, "dead_lettered": 1}},
		{"refunds", map[string]int{"retried": 2, "dead_lettered": 1}},
	} {
		for _, o := range []string{"abandoned", "dead_lettered", "duplicate", "processed", "requeued", "retried"} {
			rows = append(rows, fmt.Sprintf(`idem_consumer_deliveries_total{consumer=%q,outcome=%q,service="billing"} %d`, c.consumer, o, c.counts[o]))
		}
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(header+strings.Join(rows, "\n")+"\n"), "idem_consumer_deliveries_total"); err != nil {
		t.Fatal(err)
	}
	wantSeries(t, series(t, reg), map[string]float64{
		"idem_consumer_handle_seconds{consumer=payments,outcome=processed,service=billing}":      2,
		"idem_consumer_handle_seconds{consumer=refunds,outcome=retried,service=billing}":         2,
		"idem_consumer_dead_letters_total{consumer=payments,reason=missing_id,service=billing}":  1,
		"idem_consumer_dead_letters_total{consumer=refunds,reason=max_attempts,service=billing}": 1,
		"idem_consumer_infrastructure_retries_total{consumer=refunds,service=billing}":           0,
	})
	noLeaks(t, reg, "secret")
}

func TestConsumeInfrastructureRetry(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t, nil)
	e := newEngine(t, m, "ledger", func(context.Context, idem.Run, consume.Delivery) error {
		return idem.Retryable(errors.New("connection refused"))
	})
	handle(t, e, &fakeDelivery{id: "m1", body: []byte("x")}, consume.OutcomeRetried)
	wantSeries(t, series(t, reg), map[string]float64{
		"idem_consumer_infrastructure_retries_total{consumer=ledger}":     1,
		"idem_consumer_deliveries_total{consumer=ledger,outcome=retried}": 1,
	})
}

func TestConsumeUnknownValuesAreOther(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t, nil)
	h := m.ConsumeHooks()
	h.OnDelivery(context.Background(), consume.Event{Consumer: "c", Outcome: consume.Outcome(42)})
	h.OnDelivery(context.Background(), consume.Event{Consumer: "c", Outcome: consume.OutcomeDeadLettered, Reason: "something new"})
	h.OnDelivery(context.Background(), consume.Event{Consumer: "\xff", Outcome: consume.OutcomeProcessed})
	wantSeries(t, series(t, reg), map[string]float64{
		"idem_consumer_deliveries_total{consumer=c,outcome=other}":         1,
		"idem_consumer_dead_letters_total{consumer=c,reason=other}":        1,
		"idem_consumer_deliveries_total{consumer=other,outcome=processed}": 1,
	})
}

func TestConsumersAreCreatedAtZero(t *testing.T) {
	t.Parallel()
	_, reg := newMetrics(t, &Options{Consumers: []string{"payments"}})
	wantSeries(t, series(t, reg), map[string]float64{
		"idem_consumer_deliveries_total{consumer=payments,outcome=dead_lettered}": 0,
		"idem_consumer_deliveries_total{consumer=payments,outcome=processed}":     0,
		"idem_consumer_dead_letters_total{consumer=payments,reason=max_attempts}": 0,
	})
}

func TestMaxLabelValuesBoundsConsumers(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t, &Options{MaxLabelValues: 2})
	h := m.ConsumeHooks()
	for _, c := range []string{"a", "b", "c", "d", "a"} {
		h.OnDelivery(context.Background(), consume.Event{Consumer: c, Outcome: consume.OutcomeProcessed})
	}
	got := series(t, reg)
	wantSeries(t, got, map[string]float64{
		"idem_consumer_deliveries_total{consumer=a,outcome=processed}":     2,
		"idem_consumer_deliveries_total{consumer=b,outcome=processed}":     1,
		"idem_consumer_deliveries_total{consumer=other,outcome=processed}": 2,
	})
	for k := range got {
		if strings.Contains(k, "consumer=c") || strings.Contains(k, "consumer=d") {
			t.Errorf("unbounded series %s", k)
		}
	}
}

func TestInboxHook(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t, &Options{MaxLabelValues: 3})
	hook := m.InboxHook()
	msg := func(typ string) inbox.Message {
		return inbox.Message{Source: "orders-secret", ID: "msg-secret", Type: typ, OrderingKey: "customer-secret"}
	}
	hook(inbox.Event{Message: msg("order.created"), Outcome: inbox.Processed, Duration: 3 * time.Millisecond})
	hook(inbox.Event{Message: msg("order.created"), Outcome: inbox.Processed, Duration: time.Millisecond})
	hook(inbox.Event{Message: msg("order.created"), Outcome: inbox.Retried, Err: errors.New("x"), Duration: time.Millisecond})
	hook(inbox.Event{Message: msg("order.paid"), Outcome: inbox.Dead, Duration: time.Millisecond})
	hook(inbox.Event{Message: msg("order.paid"), Outcome: inbox.Released}) // did not run: not timed
	hook(inbox.Event{Message: msg("order.paid"), Outcome: inbox.Outcome(99), Duration: time.Millisecond})
	hook(inbox.Event{Message: msg("order.shipped"), Outcome: inbox.LeaseLost, Err: idem.ErrLeaseLost})
	hook(inbox.Event{Message: msg("spam.1"), Outcome: inbox.Processed, Duration: time.Millisecond})
	hook(inbox.Event{Message: msg("spam.2"), Outcome: inbox.Processed, Duration: time.Millisecond})

	if got := testutil.ToFloat64(m.inboxRuns.WithLabelValues("order.created", "processed")); got != 2 {
		t.Fatalf("processed = %v", got)
	}
	got := series(t, reg)
	wantSeries(t, got, map[string]float64{
		"idem_inbox_runs_total{outcome=retried,type=order.created}":    1,
		"idem_inbox_runs_total{outcome=dead,type=order.paid}":          1,
		"idem_inbox_runs_total{outcome=released,type=order.paid}":      1,
		"idem_inbox_runs_total{outcome=other,type=order.paid}":         1,
		"idem_inbox_runs_total{outcome=lease_lost,type=order.shipped}": 1,
		"idem_inbox_runs_total{outcome=processed,type=other}":          2,
		"idem_inbox_run_seconds{outcome=processed,type=order.created}": 2,
		"idem_inbox_run_seconds{outcome=dead,type=order.paid}":         1,
	})
	for _, k := range []string{
		"idem_inbox_run_seconds{outcome=released,type=order.paid}",
		"idem_inbox_run_seconds{outcome=lease_lost,type=order.shipped}",
	} {
		if _, ok := got[k]; ok {
			t.Errorf("%s timed a run that did not execute", k)
		}
	}
	noLeaks(t, reg, "secret")
}

// serveIdem runs the real idemhttp middleware under a ServeMux pattern.
func serveIdem(t *testing.T, m *Metrics) http.Handler {
	t.Helper()
	mw, err := idemhttp.New(idemtest.NewMemoryStore(nil), &idemhttp.Config{
		Principal:       idemhttp.PrincipalFromHeader("X-User"),
		RequireKey:      true,
		AllowNonDurable: true,
		OnRequest:       m.HTTPHook(),
		Logger:          quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /accounts/{account}/payments", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Fail") != "" {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"ok":true}`)
	})))
	return mux
}

func post(t *testing.T, h http.Handler, key, body string, fail bool) int {
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

func driveHTTP(t *testing.T, h http.Handler) {
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
		if got := post(t, h, c.key, c.body, c.fail); got != c.want {
			t.Fatalf("key %s: status %d, want %d", c.key, got, c.want)
		}
	}
}

func TestHTTPHookWithRealMiddleware(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t, nil)
	driveHTTP(t, serveIdem(t, m))
	if got := testutil.ToFloat64(m.httpRequests.WithLabelValues("executed", "2xx")); got != 1 {
		t.Fatalf("executed = %v", got)
	}
	const want = `
# HELP idem_http_requests_total Requests handled by the idemhttp middleware, by outcome and status class.
# TYPE idem_http_requests_total counter
idem_http_requests_total{outcome="executed",status_class="2xx"} 1
idem_http_requests_total{outcome="mismatch",status_class="4xx"} 1
idem_http_requests_total{outcome="rejected",status_class="4xx"} 1
idem_http_requests_total{outcome="released",status_class="5xx"} 1
idem_http_requests_total{outcome="replayed",status_class="2xx"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "idem_http_requests_total"); err != nil {
		t.Fatal(err)
	}
	wantSeries(t, series(t, reg), map[string]float64{
		"idem_http_request_duration_seconds{outcome=executed}": 1,
		"idem_http_request_duration_seconds{outcome=replayed}": 1,
	})
	noLeaks(t, reg, "secret", "/accounts/")
}

func TestHTTPRouteIsOptInAndUsesThePattern(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t, &Options{HTTPRoute: true})
	driveHTTP(t, serveIdem(t, m))
	// A middleware outside any mux sees no pattern.
	m.HTTPHook()(httptest.NewRequest(http.MethodPost, "/raw-secret", nil), idemhttp.Event{Key: "k", Outcome: idemhttp.OutcomeExecuted, Status: 200})
	m.HTTPHook()(nil, idemhttp.Event{Outcome: idemhttp.OutcomeExecuted, Status: 200})
	const route = "POST /accounts/{account}/payments"
	wantSeries(t, series(t, reg), map[string]float64{
		"idem_http_requests_total{outcome=executed,route=" + route + ",status_class=2xx}": 1,
		"idem_http_requests_total{outcome=executed,route=none,status_class=2xx}":          2,
		"idem_http_request_duration_seconds{outcome=mismatch,route=" + route + "}":        1,
	})
	noLeaks(t, reg, "secret")
}

func TestHTTPUnknownValuesAreOther(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t, nil)
	hook := m.HTTPHook()
	hook(nil, idemhttp.Event{Outcome: "brand_new", Status: 200})
	hook(nil, idemhttp.Event{Outcome: idemhttp.OutcomePanic, Status: 0})
	hook(nil, idemhttp.Event{Outcome: idemhttp.OutcomeError, Status: 600})
	hook(nil, idemhttp.Event{Outcome: idemhttp.OutcomeInFlight, Status: 100})
	wantSeries(t, series(t, reg), map[string]float64{
		"idem_http_requests_total{outcome=other,status_class=2xx}":     1,
		"idem_http_requests_total{outcome=panic,status_class=other}":   1,
		"idem_http_requests_total{outcome=error,status_class=other}":   1,
		"idem_http_requests_total{outcome=in_flight,status_class=1xx}": 1,
	})
}

func TestConcurrentHooks(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t, &Options{MaxLabelValues: 8, HTTPRoute: true})
	const goroutines, each = 48, 50
	var wg sync.WaitGroup
	for i := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			consumer := fmt.Sprintf("c%d", i%16) // half of them beyond the bound
			r := httptest.NewRequest(http.MethodPost, "/", nil)
			r.Pattern = fmt.Sprintf("POST /r%d", i%16)
			for range each {
				m.ConsumeHooks().OnDelivery(context.Background(), consume.Event{Consumer: consumer, Outcome: consume.OutcomeProcessed, Duration: time.Millisecond})
				m.InboxHook()(inbox.Event{Message: inbox.Message{Type: consumer}, Outcome: inbox.Processed, Duration: time.Millisecond})
				m.HTTPHook()(r, idemhttp.Event{Outcome: idemhttp.OutcomeExecuted, Status: 201, Latency: time.Millisecond})
			}
		}()
	}
	wg.Wait()
	var deliveries, runs, requests float64
	consumers := map[string]bool{}
	for k, v := range series(t, reg) {
		switch {
		case strings.HasPrefix(k, "idem_consumer_deliveries_total{"):
			deliveries += v
			consumers[strings.SplitN(strings.TrimPrefix(k, "idem_consumer_deliveries_total{consumer="), ",", 2)[0]] = true
		case strings.HasPrefix(k, "idem_inbox_runs_total{"):
			runs += v
		case strings.HasPrefix(k, "idem_http_requests_total{"):
			requests += v
		}
	}
	if want := float64(goroutines * each); deliveries != want || runs != want || requests != want {
		t.Fatalf("deliveries %v runs %v requests %v, want %v each", deliveries, runs, requests, want)
	}
	if len(consumers) != 9 || !consumers[Other] {
		t.Fatalf("consumer labels %v, want 8 names and other", consumers)
	}
}

// TestGuardHookWithRealGuard drives idem.Guard over a MemoryStore: runs,
// replays, a failure, a mismatch and a bounded guard name.
func TestGuardHookWithRealGuard(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t, &Options{MaxLabelValues: 1})
	ctx := context.Background()
	store := idemtest.NewMemoryStore(nil)
	g := idem.NewGuard(store, &idem.GuardConfig{OnDo: m.GuardHook("gateway"), Logger: quiet})
	call := func(key, body string) idem.Call {
		return idem.Call{Scope: "secret-scope", Key: key, Fingerprint: idem.FingerprintBytes([]byte(body))}
	}
	ok := func(context.Context, idem.Run) ([]byte, error) { return []byte("charged"), nil }
	for range 3 {
		if _, err := g.Do(ctx, call("secret-key-1", "a"), ok); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := g.Do(ctx, call("secret-key-1", "b"), ok); !errors.Is(err, idem.ErrFingerprintMismatch) {
		t.Fatalf("mismatch = %v", err)
	}
	boom := errors.New("boom")
	if _, err := g.Do(ctx, call("secret-key-2", "a"), func(context.Context, idem.Run) ([]byte, error) { return nil, boom }); !errors.Is(err, boom) {
		t.Fatalf("failure = %v", err)
	}
	// A second guard name is past MaxLabelValues: "other".
	g2 := idem.NewGuard(store, &idem.GuardConfig{OnDo: m.GuardHook("second"), Logger: quiet})
	if _, err := g2.Do(ctx, call("secret-key-3", "a"), ok); err != nil {
		t.Fatal(err)
	}
	m.GuardHook("gateway")(ctx, idem.DoEvent{Outcome: "brand_new"})
	wantSeries(t, series(t, reg), map[string]float64{
		"idem_guard_calls_total{guard=gateway,outcome=executed}":  1,
		"idem_guard_calls_total{guard=gateway,outcome=replayed}":  2,
		"idem_guard_calls_total{guard=gateway,outcome=mismatch}":  1,
		"idem_guard_calls_total{guard=gateway,outcome=failed}":    1,
		"idem_guard_calls_total{guard=gateway,outcome=other}":     1,
		"idem_guard_calls_total{guard=other,outcome=executed}":    1,
		"idem_guard_call_seconds{guard=gateway,outcome=replayed}": 2,
	})
	noLeaks(t, reg, "secret-scope", "secret-key")
}
