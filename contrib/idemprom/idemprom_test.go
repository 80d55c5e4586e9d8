package idemprom

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
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
	"github.com/idem-go/idem/shared/hooktest"
)

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

func TestConsumeHooksWithRealEngine(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t, &Options{ConstLabels: prometheus.Labels{"service": "billing"}})
	// payments: processed, duplicate, processed, dead-lettered (no id);
	// refunds: retried twice, then dead-lettered.
	hooktest.DriveConsume(t, context.Background(), []idem.Hook{m})

	if got := testutil.ToFloat64(m.deliveries.WithLabelValues("payments", "processed")); got != 2 {
		t.Fatalf("payments processed = %v", got)
	}
	if got := testutil.ToFloat64(m.deadLetters.WithLabelValues("refunds", string(idem.DeadMaxAttempts))); got != 1 {
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
		for _, o := range []string{"abandoned", "dead_lettered", "duplicate", "panicked", "processed", "requeued", "retried"} {
			rows = append(rows, fmt.Sprintf(`idem_consumer_deliveries_total{consumer=%q,outcome=%q,service="billing"} %d`, c.consumer, o, c.counts[o]))
		}
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(header+strings.Join(rows, "\n")+"\n"), "idem_consumer_deliveries_total"); err != nil {
		t.Fatal(err)
	}
	hooktest.WantCounts(t, series(t, reg), map[string]float64{
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
	e := hooktest.NewEngine(t, []idem.Hook{m}, "ledger", func(context.Context, idem.Run, consume.Delivery) error {
		return idem.Retryable(errors.New("connection refused"))
	})
	hooktest.Handle(t, context.Background(), e, hooktest.NewDelivery("m1", "x"), idem.Retried)
	hooktest.WantCounts(t, series(t, reg), map[string]float64{
		"idem_consumer_infrastructure_retries_total{consumer=ledger}":     1,
		"idem_consumer_deliveries_total{consumer=ledger,outcome=retried}": 1,
	})
}

func TestConsumeUnknownValuesAreOther(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t, nil)
	m.OnDeliveryEnd(context.Background(), consume.Event{Consumer: "c", Outcome: idem.Outcome("brand_new")})
	m.OnDeliveryEnd(context.Background(), consume.Event{Consumer: "c", Outcome: idem.DeadLettered, Reason: "something new"})
	m.OnDeliveryEnd(context.Background(), consume.Event{Consumer: "\xff", Outcome: idem.Processed})
	hooktest.WantCounts(t, series(t, reg), map[string]float64{
		"idem_consumer_deliveries_total{consumer=c,outcome=other}":         1,
		"idem_consumer_dead_letters_total{consumer=c,reason=other}":        1,
		"idem_consumer_deliveries_total{consumer=other,outcome=processed}": 1,
	})
}

func TestConsumersAreCreatedAtZero(t *testing.T) {
	t.Parallel()
	_, reg := newMetrics(t, &Options{Consumers: []string{"payments"}})
	hooktest.WantCounts(t, series(t, reg), map[string]float64{
		"idem_consumer_deliveries_total{consumer=payments,outcome=dead_lettered}": 0,
		"idem_consumer_deliveries_total{consumer=payments,outcome=processed}":     0,
		"idem_consumer_dead_letters_total{consumer=payments,reason=max_attempts}": 0,
	})
}

func TestMaxLabelValuesBoundsConsumers(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t, &Options{MaxLabelValues: 2})
	for _, c := range []string{"a", "b", "c", "d", "a"} {
		m.OnDeliveryEnd(context.Background(), consume.Event{Consumer: c, Outcome: idem.Processed})
	}
	got := series(t, reg)
	hooktest.WantCounts(t, got, map[string]float64{
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
	// The released row did not run, and the lease was lost before the
	// run: neither is timed.
	hooktest.DriveInbox(context.Background(), []idem.Hook{m})

	if got := testutil.ToFloat64(m.inboxRuns.WithLabelValues("order.created", "processed")); got != 2 {
		t.Fatalf("processed = %v", got)
	}
	got := series(t, reg)
	hooktest.WantCounts(t, got, map[string]float64{
		"idem_inbox_runs_total{outcome=retried,type=order.created}":          1,
		"idem_inbox_runs_total{outcome=dead_lettered,type=order.paid}":       1,
		"idem_inbox_runs_total{outcome=released,type=order.paid}":            1,
		"idem_inbox_runs_total{outcome=other,type=order.paid}":               1,
		"idem_inbox_runs_total{outcome=lease_lost,type=order.shipped}":       1,
		"idem_inbox_runs_total{outcome=processed,type=other}":                2,
		"idem_inbox_run_seconds{outcome=processed,type=order.created}":       2,
		"idem_inbox_run_seconds{outcome=dead_lettered,type=order.paid}":      1,
		"idem_inbox_dead_letters_total{reason=max_attempts,type=order.paid}": 1,
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

// The real worker reports each dead letter's reason.
func TestInboxHookWithRealWorker(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t, nil)
	w := hooktest.NewWorker(t, []idem.Hook{m})
	if n, err := w.RunOnce(context.Background()); err != nil || n != 6 {
		t.Fatalf("RunOnce: %d, %v", n, err)
	}
	hooktest.WantCounts(t, series(t, reg), map[string]float64{
		"idem_inbox_runs_total{outcome=processed,type=order.created}":           1,
		"idem_inbox_runs_total{outcome=lease_lost,type=order.created}":          1,
		"idem_inbox_runs_total{outcome=retried,type=order.failing}":             1,
		"idem_inbox_dead_letters_total{reason=max_attempts,type=order.failing}": 1,
		"idem_inbox_dead_letters_total{reason=permanent,type=order.permanent}":  1,
		"idem_inbox_dead_letters_total{reason=no_handler,type=order.unknown}":   1,
		"idem_inbox_runs_total{outcome=dead_lettered,type=order.unknown}":       1,
	})
	noLeaks(t, reg, "secret", "msg-")
}

func TestInboxUnknownReasonIsOther(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t, nil)
	m.OnRunEnd(context.Background(), inbox.Event{Message: inbox.Message{Type: "t"}, Outcome: idem.DeadLettered, DeadReason: "something new"})
	hooktest.WantCounts(t, series(t, reg), map[string]float64{
		"idem_inbox_dead_letters_total{reason=other,type=t}": 1,
	})
}

func TestHTTPHookWithRealMiddleware(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t, nil)
	hooktest.DriveHTTP(t, hooktest.ServeIdem(t, []idem.Hook{m}))
	if got := testutil.ToFloat64(m.httpRequests.WithLabelValues("processed", "2xx")); got != 1 {
		t.Fatalf("executed = %v", got)
	}
	const want = `
# HELP idem_http_requests_total Requests handled by the idemhttp middleware, by outcome and status class.
# TYPE idem_http_requests_total counter
idem_http_requests_total{outcome="processed",status_class="2xx"} 1
idem_http_requests_total{outcome="mismatch",status_class="4xx"} 1
idem_http_requests_total{outcome="rejected",status_class="4xx"} 1
idem_http_requests_total{outcome="released",status_class="5xx"} 1
idem_http_requests_total{outcome="duplicate",status_class="2xx"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "idem_http_requests_total"); err != nil {
		t.Fatal(err)
	}
	hooktest.WantCounts(t, series(t, reg), map[string]float64{
		"idem_http_request_duration_seconds{outcome=processed}": 1,
		"idem_http_request_duration_seconds{outcome=duplicate}": 1,
	})
	noLeaks(t, reg, "secret", "/accounts/")
}

func TestHTTPRouteIsOptInAndUsesThePattern(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t, &Options{HTTPRoute: true})
	hooktest.DriveHTTP(t, hooktest.ServeIdem(t, []idem.Hook{m}))
	// A middleware outside any mux sees no pattern.
	m.OnRequestEnd(context.Background(), idemhttp.Event{Request: httptest.NewRequest(http.MethodPost, "/raw-secret", nil),
		Key: "k", Outcome: idem.Processed, Status: 200})
	m.OnRequestEnd(context.Background(), idemhttp.Event{Outcome: idem.Processed, Status: 200})
	const route = "POST /accounts/{account}/payments"
	hooktest.WantCounts(t, series(t, reg), map[string]float64{
		"idem_http_requests_total{outcome=processed,route=" + route + ",status_class=2xx}": 1,
		"idem_http_requests_total{outcome=processed,route=none,status_class=2xx}":          2,
		"idem_http_request_duration_seconds{outcome=mismatch,route=" + route + "}":         1,
	})
	noLeaks(t, reg, "secret")
}

func TestHTTPUnknownValuesAreOther(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t, nil)
	ctx := context.Background()
	m.OnRequestEnd(ctx, idemhttp.Event{Outcome: "brand_new", Status: 200})
	m.OnRequestEnd(ctx, idemhttp.Event{Outcome: "executed", Status: 200}) // a label before idem.Outcome
	m.OnRequestEnd(ctx, idemhttp.Event{Outcome: idem.Panicked, Status: 0})
	m.OnRequestEnd(ctx, idemhttp.Event{Outcome: idem.Errored, Status: 600})
	m.OnRequestEnd(ctx, idemhttp.Event{Outcome: idem.InProgress, Status: 100})
	hooktest.WantCounts(t, series(t, reg), map[string]float64{
		"idem_http_requests_total{outcome=other,status_class=2xx}":       2,
		"idem_http_requests_total{outcome=panicked,status_class=other}":  1,
		"idem_http_requests_total{outcome=error,status_class=other}":     1,
		"idem_http_requests_total{outcome=in_progress,status_class=1xx}": 1,
	})
}

func TestConcurrentHooks(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t, &Options{MaxLabelValues: 8, HTTPRoute: true})
	const goroutines, each = 48, 50
	// Half of the 16 consumer and guard names are beyond the bound.
	hooktest.ReportConcurrently(goroutines, each, func(name string) idem.Hook { return m.For(name) })
	var deliveries, runs, requests, calls float64
	consumers, guards := map[string]bool{}, map[string]bool{}
	for k, v := range series(t, reg) {
		switch {
		case strings.HasPrefix(k, "idem_consumer_deliveries_total{"):
			deliveries += v
			consumers[strings.SplitN(strings.TrimPrefix(k, "idem_consumer_deliveries_total{consumer="), ",", 2)[0]] = true
		case strings.HasPrefix(k, "idem_inbox_runs_total{"):
			runs += v
		case strings.HasPrefix(k, "idem_http_requests_total{"):
			requests += v
		case strings.HasPrefix(k, "idem_guard_calls_total{"):
			calls += v
			guards[strings.SplitN(strings.TrimPrefix(k, "idem_guard_calls_total{guard="), ",", 2)[0]] = true
		}
	}
	if want := float64(goroutines * each); deliveries != want || runs != want || requests != want || calls != want {
		t.Fatalf("deliveries %v runs %v requests %v guard calls %v, want %v each", deliveries, runs, requests, calls, want)
	}
	if len(consumers) != 9 || !consumers[Other] {
		t.Fatalf("consumer labels %v, want 8 names and other", consumers)
	}
	if len(guards) != 9 || !guards[Other] {
		t.Fatalf("guard labels %v, want 8 names and other", guards)
	}
}

// TestGuardHookWithRealGuard drives idem.Guard over a MemoryStore: runs,
// replays, a failure, a mismatch and a bounded guard name.
func TestGuardHookWithRealGuard(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t, &Options{MaxLabelValues: 1})
	ctx := context.Background()
	store := idemtest.NewMemoryStore(nil)
	gateway := m.For("gateway")
	hooktest.DriveGuard(t, ctx, hooktest.NewGuard(store, []idem.Hook{gateway}))
	// A second guard name is past MaxLabelValues: "other".
	g2 := hooktest.NewGuard(store, []idem.Hook{m.For("second")})
	if _, err := g2.Do(ctx, hooktest.Call("secret-key-3", "a"), hooktest.Charge); err != nil {
		t.Fatal(err)
	}
	// A Guard given m itself reports as "default", outside the bound.
	if _, err := hooktest.NewGuard(store, []idem.Hook{m}).Do(ctx, hooktest.Call("secret-key-4", "a"), hooktest.Charge); err != nil {
		t.Fatal(err)
	}
	gateway.OnDoEnd(ctx, idem.DoEvent{Outcome: "brand_new"})
	// An execution that sent heartbeats reports its slowest one.
	gateway.OnDoEnd(ctx, idem.DoEvent{Outcome: idem.Processed, Heartbeats: 3, SlowestHeartbeat: 2 * time.Second})
	hooktest.WantCounts(t, series(t, reg), map[string]float64{
		"idem_guard_heartbeat_max_seconds{guard=gateway}":          1,
		"idem_guard_calls_total{guard=gateway,outcome=processed}":  2,
		"idem_guard_calls_total{guard=gateway,outcome=duplicate}":  2,
		"idem_guard_calls_total{guard=gateway,outcome=mismatch}":   1,
		"idem_guard_calls_total{guard=gateway,outcome=released}":   1,
		"idem_guard_calls_total{guard=gateway,outcome=other}":      1,
		"idem_guard_calls_total{guard=other,outcome=processed}":    1,
		"idem_guard_calls_total{guard=default,outcome=processed}":  1,
		"idem_guard_call_seconds{guard=gateway,outcome=duplicate}": 2,
	})
	noLeaks(t, reg, "secret-scope", "secret-key")
}
