package idemotel_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/contrib/idemotel"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemtest"
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

// Trace and count idempotent HTTP requests: a first request, its retry
// (replayed) and the key reused with another body (mismatch). Each request
// gets an idem.http span under the server span, here started by hand where
// otelhttp would start it.
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
	// examples and tests only.
	mw, err := idemhttp.New(idemtest.NewMemoryStore(nil), &idemhttp.Config{
		Principal:       idemhttp.PrincipalFromHeader("X-User"),
		AllowNonDurable: true,
		OnRequest:       tel.HTTPHook(),
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
	for _, s := range spans.Ended() {
		if s.Name() != "idem.http" {
			continue
		}
		attrs := map[string]string{}
		for _, a := range s.Attributes() {
			attrs[string(a.Key)] = a.Value.String()
		}
		fmt.Println(s.Name(), attrs["idem.outcome"], attrs["http.response.status_code"], attrs["http.route"],
			"status:", s.Status().Code, "has parent:", s.Parent().IsValid())
	}
	fmt.Println(counts(reader, "idem.http.requests", "idem.outcome"))
	// Output:
	// idem.http processed 201 /payments status: Unset has parent: true
	// idem.http duplicate 201 /payments status: Unset has parent: true
	// idem.http mismatch 422 /payments status: Unset has parent: true
	// map[duplicate:1 mismatch:1 processed:1]
}

// A dead letter is an error span and a dead_letters point by reason; the
// span lasts the duration the engine reported.
func ExampleTelemetry_ConsumeHooks() {
	reader, spans := sdkmetric.NewManualReader(), tracetest.NewSpanRecorder()
	tel, err := idemotel.New(&idemotel.Options{
		MeterProvider:  sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
		TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)),
		Consumers:      []string{"payments"},
	})
	if err != nil {
		panic(err)
	}
	// In production: consume.New(process, &consume.Config{Name: "payments", Hooks: tel.ConsumeHooks()}).
	// Here the engine's reports are made by hand.
	hooks := tel.ConsumeHooks()
	ctx := context.Background()
	hooks.OnDelivery(ctx, consume.Event{Consumer: "payments", ID: "m-1", Attempt: 1,
		Outcome: consume.OutcomeProcessed, Duration: 20 * time.Millisecond})
	hooks.OnDelivery(ctx, consume.Event{Consumer: "payments", ID: "m-2", Attempt: 1,
		Outcome: consume.OutcomeDeadLettered, Reason: consume.ReasonPermanent,
		Err: errors.New("invalid IBAN"), Duration: 5 * time.Millisecond})

	for _, s := range spans.Ended() {
		fmt.Printf("%s %v %v %q\n", s.Name(), s.EndTime().Sub(s.StartTime()), s.Status().Code, s.Status().Description)
	}
	fmt.Println(counts(reader, "idem.consumer.dead_letters", "idem.dead_letter.reason"))
	// Output:
	// idem.consume 20ms Unset ""
	// idem.consume 5ms Error "dead_lettered: permanent"
	// map[max_attempts:0 permanent:1]
}

// Report to idemotel and to your own hooks at once.
func ExampleMultiConsumeHooks() {
	tel, err := idemotel.New(nil) // the otel globals
	if err != nil {
		panic(err)
	}
	var counters consume.Counters
	hooks := idemotel.MultiConsumeHooks(tel.ConsumeHooks(), &counters)
	// consume.New(process, &consume.Config{Name: "payments", Hooks: hooks})
	hooks.OnDelivery(context.Background(), consume.Event{Consumer: "payments", Outcome: consume.OutcomeDuplicate})
	fmt.Println(counters.Snapshot().Duplicate)
	// Output:
	// 1
}
