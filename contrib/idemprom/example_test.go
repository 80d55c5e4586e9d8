package idemprom_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/contrib/idemprom"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/outbox/outboxtest"
)

// Count idempotent HTTP requests by outcome: a first request, its retry
// (replayed), and the key reused with another body (mismatch).
func Example() {
	reg := prometheus.NewRegistry()
	m, err := idemprom.New(reg, nil)
	if err != nil {
		panic(err)
	}
	// Production code passes a durable store; the memory store is for
	// examples and tests only.
	mw, err := idemhttp.New(idemtest.NewMemoryStore(nil), &idemhttp.Config{
		Principal:       idemhttp.PrincipalFromHeader("X-User"),
		AllowNonDurable: true,
		Hooks:           []idem.Hook{m},
	})
	if err != nil {
		panic(err)
	}
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"charge":"ch_1"}`)
	}))
	for _, body := range []string{`{"amount":100}`, `{"amount":100}`, `{"amount":500}`} {
		r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("X-User", "alice")
		r.Header.Set("Idempotency-Key", `"pay-1"`)
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	n, _ := testutil.GatherAndCount(reg, "idem_http_requests_total")
	fmt.Println("series:", n)
	err = testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP idem_http_requests_total Requests handled by the idemhttp middleware, by outcome and status class.
# TYPE idem_http_requests_total counter
idem_http_requests_total{outcome="duplicate",status_class="2xx"} 1
idem_http_requests_total{outcome="mismatch",status_class="4xx"} 1
idem_http_requests_total{outcome="processed",status_class="2xx"} 1
`), "idem_http_requests_total")
	fmt.Println("compare:", err)
	// Output:
	// series: 3
	// compare: <nil>
}

// Pass the same Metrics to every component's Hooks; dead letters are
// counted by reason, and the delivery series exist at zero from the start
// so that an increase() alert sees the first one.
func ExampleMetrics_consumer() {
	reg := prometheus.NewRegistry()
	m, err := idemprom.New(reg, &idemprom.Options{
		ConstLabels: prometheus.Labels{"service": "billing"},
		Consumers:   []string{"payments"},
	})
	if err != nil {
		panic(err)
	}
	// In production: consume.New(process, &consume.Config{Name: "payments", Hooks: []idem.Hook{m}}).
	// Here the engine's reports are made by hand.
	ctx := context.Background()
	m.OnDeliveryEnd(ctx, consume.Event{Consumer: "payments", Outcome: idem.Processed})
	m.OnDeliveryEnd(ctx, consume.Event{Consumer: "payments", Outcome: idem.DeadLettered, Reason: idem.DeadPermanent})

	err = testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP idem_consumer_dead_letters_total Deliveries moved to the dead letters, by reason. Normally zero.
# TYPE idem_consumer_dead_letters_total counter
idem_consumer_dead_letters_total{consumer="payments",reason="max_attempts",service="billing"} 0
idem_consumer_dead_letters_total{consumer="payments",reason="permanent",service="billing"} 1
`), "idem_consumer_dead_letters_total")
	fmt.Println(err)
	// Output:
	// <nil>
}

// Name each Guard, so that its calls and heartbeats have a series of
// their own.
func ExampleMetrics_For() {
	reg := prometheus.NewRegistry()
	m, err := idemprom.New(reg, nil)
	if err != nil {
		panic(err)
	}
	guard := idem.NewGuard(idemtest.NewMemoryStore(nil), &idem.GuardConfig{Hooks: []idem.Hook{m.For("payments-gateway")}})
	charge := func(context.Context, idem.Run) ([]byte, error) { return []byte("ch_1"), nil }
	call := idem.Call{Scope: "alice", Key: "pay-1", Fingerprint: idem.FingerprintBytes([]byte("100"))}
	for range 2 {
		if _, err := guard.Do(context.Background(), call, charge); err != nil {
			panic(err)
		}
	}
	err = testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP idem_guard_calls_total Calls of idem.Guard.Do, by guard name and outcome.
# TYPE idem_guard_calls_total counter
idem_guard_calls_total{guard="payments-gateway",outcome="duplicate"} 1
idem_guard_calls_total{guard="payments-gateway",outcome="processed"} 1
`), "idem_guard_calls_total")
	fmt.Println(err)
	// Output:
	// <nil>
}

// A second Metrics on the same registry is refused.
func ExampleNew_duplicate() {
	reg := prometheus.NewRegistry()
	if _, err := idemprom.New(reg, nil); err != nil {
		panic(err)
	}
	_, err := idemprom.New(reg, nil)
	fmt.Println(err != nil)
	// Output:
	// true
}

// Count an outbox relay's events by outcome, with the topics you alert on
// as a label: the broker confirms one event and refuses another for good,
// which goes to the dead state. The relay is named with For.
func ExampleMetrics_outbox() {
	reg := prometheus.NewRegistry()
	m, err := idemprom.New(reg, &idemprom.Options{OutboxTopics: []string{"orders.created"}})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	// The in-memory outbox stands for a SQL store's (idempgx's
	// Store.Outbox()), and the publisher for a broker's.
	ob := outboxtest.NewMemory()
	err = ob.InTx(ctx, func(ctx context.Context, tx *outboxtest.MemoryTx) error {
		return ob.Write(ctx, tx,
			outbox.Event{ID: "order-created-1001", Topic: "orders.created", Payload: []byte(`{"order":"1001"}`)},
			outbox.Event{ID: "order-created-1002", Topic: "orders.created", Payload: []byte(`{"order":"1002"}`)})
	})
	if err != nil {
		panic(err)
	}
	pub := outbox.PublisherFunc(func(ctx context.Context, msgs []outbox.Message) []error {
		errs := make([]error, len(msgs))
		errs[1] = outbox.PermanentError(errors.New("message too large"))
		return errs
	})
	relay, err := outbox.NewRelay(ob, pub, &outbox.Config{Hooks: []idem.Hook{m.For("orders")},
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	if _, err := relay.RunOnce(ctx); err != nil { // Run(ctx) in a service
		panic(err)
	}
	err = testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP idem_outbox_dead_letters_total Outbox events moved to the dead state, by relay name and reason. Normally zero.
# TYPE idem_outbox_dead_letters_total counter
idem_outbox_dead_letters_total{reason="max_attempts",relay="orders",topic="orders.created"} 0
idem_outbox_dead_letters_total{reason="permanent",relay="orders",topic="orders.created"} 1
`), "idem_outbox_dead_letters_total")
	fmt.Println(err)
	sent, _ := testutil.GatherAndCount(reg, "idem_outbox_lag_seconds")
	fmt.Println("lag series:", sent)
	// Output:
	// <nil>
	// lag series: 1
}
