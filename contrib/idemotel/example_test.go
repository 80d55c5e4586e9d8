package idemotel_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/contrib/idemotel"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/outbox/outboxtest"
)

// counts collects reader and returns the values of one counter by the
// value of one attribute.
func counts(reader *sdkmetric.ManualReader, name, attr string) map[string]int64 {
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		panic(err)
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == name {
				for _, dp := range sum.DataPoints {
					v, _ := dp.Attributes.Value(attribute.Key(attr))
					out[v.String()] += dp.Value
				}
			}
		}
	}
	return out
}

// names returns the names of spans by span id, to print a span's parent.
func names(spans []sdktrace.ReadOnlySpan) map[trace.SpanID]string {
	out := map[trace.SpanID]string{}
	for _, s := range spans {
		out[s.SpanContext().SpanID()] = s.Name()
	}
	return out
}

// Trace and count idempotent HTTP requests: a first request, its retry
// (replayed) and the key reused with another body (mismatch). Each request
// gets an idem.http span under the server span, here started by hand where
// otelhttp would start it, and the middleware's Guard an idem.guard span
// under it, the parent of the handler's spans.
func Example() {
	reader, spans := sdkmetric.NewManualReader(), tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	tel, err := idemotel.New(&idemotel.Options{
		MeterProvider:  sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
		TracerProvider: tp,
	})
	if err != nil {
		panic(err)
	}
	// Production code passes a durable store; the memory store is for
	// examples and tests only. With idemprom too: Hooks: []idem.Hook{metrics, tel}.
	mw, err := idemhttp.New(idemtest.NewMemoryStore(nil), &idemhttp.Config{
		Principal:       idemhttp.PrincipalFromHeader("X-User"),
		AllowNonDurable: true,
		Hooks:           []idem.Hook{tel.For("payments-api")},
	})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"charge":"ch_1"}`)
	})))
	for _, body := range []string{`{"amount":100}`, `{"amount":100}`, `{"amount":500}`} {
		r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("X-User", "alice")
		r.Header.Set("Idempotency-Key", `"pay-1"`)
		ctx, server := tp.Tracer("server").Start(r.Context(), "POST /payments")
		mux.ServeHTTP(httptest.NewRecorder(), r.WithContext(ctx))
		server.End()
	}
	ended := spans.Ended()
	name := names(ended)
	for _, s := range ended {
		if s.Name() == "POST /payments" {
			continue
		}
		attrs := map[string]string{}
		for _, a := range s.Attributes() {
			attrs[string(a.Key)] = a.Value.String()
		}
		fmt.Println(s.Name(), attrs["idem.outcome"], attrs["http.response.status_code"], attrs["http.route"],
			"status:", s.Status().Code, "parent:", name[s.Parent().SpanID()])
	}
	fmt.Println(counts(reader, "idem.http.requests", "idem.outcome"))
	// Output:
	// idem.guard processed   status: Unset parent: idem.http
	// idem.http processed 201 /payments status: Unset parent: POST /payments
	// idem.guard duplicate   status: Unset parent: idem.http
	// idem.http duplicate 201 /payments status: Unset parent: POST /payments
	// idem.guard mismatch   status: Unset parent: idem.http
	// idem.http mismatch 422 /payments status: Unset parent: POST /payments
	// map[duplicate:1 mismatch:1 processed:1]
}

// A consumer's deliveries: the engine calls the start hook as a delivery
// arrives (the span starts, under the broker adapter's span, and the
// handler runs in it) and the end hook with its outcome. A dead letter is
// an error span and a dead_letters point by reason.
func Example_consumer() {
	reader, spans := sdkmetric.NewManualReader(), tracetest.NewSpanRecorder()
	tel, err := idemotel.New(&idemotel.Options{
		MeterProvider:  sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
		TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)),
		Consumers:      []string{"payments"},
	})
	if err != nil {
		panic(err)
	}
	// In production: consume.New(process, &consume.Config{Name: "payments", Hooks: []idem.Hook{metrics, tel}}).
	// Here the engine's calls are made by hand.
	for _, ev := range []consume.Event{
		{Consumer: "payments", ID: "m-1", Attempt: 1, Outcome: idem.Processed, Duration: 20 * time.Millisecond},
		{Consumer: "payments", ID: "m-2", Attempt: 1, Outcome: idem.DeadLettered, Reason: idem.DeadPermanent,
			Err: errors.New("invalid IBAN"), Duration: 5 * time.Millisecond},
	} {
		ctx := tel.OnDeliveryStart(context.Background(), consume.Event{Consumer: ev.Consumer, ID: ev.ID, Attempt: ev.Attempt})
		// … the handler runs with ctx …
		tel.OnDeliveryEnd(ctx, ev)
	}

	for _, s := range spans.Ended() {
		fmt.Printf("%s %v %q\n", s.Name(), s.Status().Code, s.Status().Description)
	}
	fmt.Println(counts(reader, "idem.consumer.dead_letters", "idem.dead_letter.reason"))
	// Output:
	// idem.consume Unset ""
	// idem.consume Error "dead_lettered: permanent"
	// map[max_attempts:0 permanent:1]
}

// Name each Guard, so that its calls have series of their own; the span
// of each call is the parent of the spans the guarded function starts.
func ExampleTelemetry_For() {
	reader, spans := sdkmetric.NewManualReader(), tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	tel, err := idemotel.New(&idemotel.Options{
		MeterProvider:  sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
		TracerProvider: tp,
	})
	if err != nil {
		panic(err)
	}
	// With idemprom too: Hooks: []idem.Hook{metrics.For("payments-gateway"), tel.For("payments-gateway")}.
	guard := idem.NewGuard(idemtest.NewMemoryStore(nil), &idem.GuardConfig{Hooks: []idem.Hook{tel.For("payments-gateway")}})
	charge := func(ctx context.Context, _ idem.Run) ([]byte, error) {
		_, span := tp.Tracer("gateway").Start(ctx, "POST /v1/charges")
		defer span.End()
		return []byte("ch_1"), nil
	}
	call := idem.Call{Scope: "alice", Key: "pay-1", Fingerprint: idem.FingerprintBytes([]byte("100"))}
	for range 2 {
		if _, err := guard.Do(context.Background(), call, charge); err != nil {
			panic(err)
		}
	}
	ended := spans.Ended()
	name := names(ended)
	for _, s := range ended {
		parent := "none"
		if s.Parent().IsValid() {
			parent = name[s.Parent().SpanID()]
		}
		fmt.Println(s.Name(), "parent:", parent)
	}
	fmt.Println(counts(reader, "idem.guard.calls", "idem.guard"))
	// Output:
	// POST /v1/charges parent: idem.guard
	// idem.guard parent: none
	// idem.guard parent: none
	// map[payments-gateway:2]
}

// An outbox relay's batch: one idem.outbox span per batch, the parent of
// the publisher's spans, with one span event per event; the broker
// confirms one event and refuses the other for good, which goes to the
// dead state and makes the span an error.
func ExampleTelemetry_outbox() {
	reader, spans := sdkmetric.NewManualReader(), tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	tel, err := idemotel.New(&idemotel.Options{
		MeterProvider:  sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
		TracerProvider: tp,
	})
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
		_, send := tp.Tracer("broker").Start(ctx, "orders.created send")
		defer send.End()
		return []error{nil, outbox.PermanentError(errors.New("message too large"))}
	})
	relay, err := outbox.NewRelay(ob, pub, &outbox.Config{Hooks: []idem.Hook{tel.For("orders")},
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	if _, err := relay.RunOnce(ctx); err != nil { // Run(ctx) in a service
		panic(err)
	}
	ended := spans.Ended()
	name := names(ended)
	for _, s := range ended {
		attrs := map[string]string{}
		for _, a := range s.Attributes() {
			attrs[string(a.Key)] = a.Value.String()
		}
		parent, ok := name[s.Parent().SpanID()]
		if !ok {
			parent = "none"
		}
		fmt.Printf("%s %s relay=%s topic=%s status=%s %q parent=%s\n", s.Name(), s.SpanKind(), attrs["idem.relay"],
			attrs["messaging.destination.name"], s.Status().Code, s.Status().Description, parent)
		for _, e := range s.Events() {
			ev := map[string]string{}
			for _, a := range e.Attributes {
				ev[string(a.Key)] = a.Value.String()
			}
			fmt.Printf("  %s %s outcome=%s reason=%s\n", e.Name, ev["messaging.message.id"], ev["idem.outcome"], ev["idem.dead_letter.reason"])
		}
	}
	fmt.Println(counts(reader, "idem.outbox.events", "idem.outcome"))
	// Output:
	// orders.created send internal relay= topic= status=Unset "" parent=idem.outbox
	// idem.outbox client relay=orders topic=orders.created status=Error "dead_lettered 1 of 2" parent=none
	//   idem.outbox.message order-created-1001 outcome=processed reason=
	//   idem.outbox.message order-created-1002 outcome=dead_lettered reason=permanent
	// map[dead_lettered:1 lease_lost:0 not_recorded:0 panicked:0 processed:1 released:0 retried:0]
}
