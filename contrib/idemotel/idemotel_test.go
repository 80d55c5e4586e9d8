package idemotel

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/exemplar"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/retry"
	"github.com/idem-go/idem/shared/hooktest"
)

// rig is a Telemetry over a real SDK: a manual metric reader and a span
// recorder.
type rig struct {
	tel    *Telemetry
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
}

func newRig(t *testing.T, opts *Options) *rig {
	t.Helper()
	var o Options
	if opts != nil {
		o = *opts
	}
	r := &rig{reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	o.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(r.reader))
	r.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(r.spans))
	o.TracerProvider = r.tp
	tel, err := New(&o)
	if err != nil {
		t.Fatal(err)
	}
	r.tel = tel
	return r
}

func (r *rig) collect(t *testing.T) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	return rm
}

func seriesKey(name string, set attribute.Set) string {
	var kv []string
	for _, a := range set.ToSlice() {
		kv = append(kv, string(a.Key)+"="+a.Value.String())
	}
	return name + "{" + strings.Join(kv, ",") + "}"
}

// points returns, per "name{k=v,...}" (keys sorted), a counter's value or
// a histogram's count.
func (r *rig) points(t *testing.T) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, sm := range r.collect(t).ScopeMetrics {
		if sm.Scope.Name != ScopeName {
			t.Errorf("instrumentation scope %q", sm.Scope.Name)
		}
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				if !d.IsMonotonic {
					t.Errorf("%s is not monotonic", m.Name)
				}
				for _, dp := range d.DataPoints {
					out[seriesKey(m.Name, dp.Attributes)] = float64(dp.Value)
				}
			case metricdata.Histogram[float64]:
				if m.Unit != "s" {
					t.Errorf("%s has unit %q", m.Name, m.Unit)
				}
				for _, dp := range d.DataPoints {
					out[seriesKey(m.Name, dp.Attributes)] = float64(dp.Count)
				}
			default:
				t.Fatalf("unexpected data %T for %s", m.Data, m.Name)
			}
		}
	}
	return out
}

// histogram returns one histogram point by its series key.
func (r *rig) histogram(t *testing.T, key string) metricdata.HistogramDataPoint[float64] {
	t.Helper()
	for _, sm := range r.collect(t).ScopeMetrics {
		for _, m := range sm.Metrics {
			if d, ok := m.Data.(metricdata.Histogram[float64]); ok {
				for _, dp := range d.DataPoints {
					if seriesKey(m.Name, dp.Attributes) == key {
						return dp
					}
				}
			}
		}
	}
	t.Fatalf("no histogram point %s", key)
	return metricdata.HistogramDataPoint[float64]{}
}

// forbidden are metric attributes that would leak per-request data.
var forbidden = map[attribute.Key]bool{
	attrKey: true, attrScopeHash: true, attrInboxSource: true, attrOrderingKey: true,
	"messaging.message.id": true, "url.path": true, "url.full": true, "enduser.id": true,
}

// noLeaks fails if a metric attribute is per-request data or any value
// contains one of the secrets.
func (r *rig) noLeaks(t *testing.T, secrets ...string) {
	t.Helper()
	got := r.points(t)
	if len(got) == 0 {
		t.Fatal("nothing collected")
	}
	for k := range got {
		for f := range forbidden {
			if strings.Contains(k, string(f)+"=") {
				t.Errorf("%s has attribute %s", k, f)
			}
		}
		for _, s := range secrets {
			if strings.Contains(k, s) {
				t.Errorf("%s leaks %q", k, s)
			}
		}
	}
}

func (r *rig) ended(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range r.spans.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// byID returns the ended span sc, failing t if it did not end.
func (r *rig) byID(t *testing.T, what string, sc trace.SpanContext) sdktrace.ReadOnlySpan {
	t.Helper()
	for _, s := range r.spans.Ended() {
		if s.SpanContext().SpanID() == sc.SpanID() {
			return s
		}
	}
	t.Fatalf("%s did not end", what)
	return nil
}

func attrsOf(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, a := range s.Attributes() {
		m[a.Key] = a.Value
	}
	return m
}

func str(s sdktrace.ReadOnlySpan, k attribute.Key) string {
	return attrsOf(s)[k].AsString()
}

// exception returns the attributes of the span's exception event, or nil.
func exception(s sdktrace.ReadOnlySpan) map[attribute.Key]string {
	for _, e := range s.Events() {
		if e.Name == "exception" {
			m := map[attribute.Key]string{}
			for _, a := range e.Attributes {
				m[a.Key] = a.Value.AsString()
			}
			return m
		}
	}
	return nil
}

// spanLeaks fails if any span attribute, status or event carries a secret.
func spanLeaks(t *testing.T, spans []sdktrace.ReadOnlySpan, secrets ...string) {
	t.Helper()
	for _, s := range spans {
		texts := []string{s.Status().Description}
		for _, a := range s.Attributes() {
			texts = append(texts, a.Value.String())
		}
		for _, e := range s.Events() {
			for _, a := range e.Attributes {
				texts = append(texts, a.Value.String())
			}
		}
		for _, text := range texts {
			for _, secret := range secrets {
				if strings.Contains(text, secret) {
					t.Errorf("span %s leaks %q in %q", s.Name(), secret, text)
				}
			}
		}
	}
}

// wantWithin checks that a span started and ended within [before, after]:
// it is a real span over the work, not one made after the fact.
func wantWithin(t *testing.T, s sdktrace.ReadOnlySpan, before, after time.Time) {
	t.Helper()
	if s.StartTime().Before(before) || s.EndTime().After(after) || s.EndTime().Before(s.StartTime()) {
		t.Errorf("span %s from %v to %v, outside the work [%v, %v]", s.Name(), s.StartTime(), s.EndTime(), before, after)
	}
}

// childOf fails t unless s is a child of the span parent.
func childOf(t *testing.T, what string, s sdktrace.ReadOnlySpan, parent trace.SpanContext) {
	t.Helper()
	if s.Parent().SpanID() != parent.SpanID() || s.SpanContext().TraceID() != parent.TraceID() {
		t.Errorf("%s: parent %v, want %v", what, s.Parent().SpanID(), parent.SpanID())
	}
}

func TestNewRejectsNegativeMaxLabelValues(t *testing.T) {
	t.Parallel()
	if _, err := New(&Options{MaxLabelValues: -1}); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("got %v", err)
	}
}

func TestNewRejectsBadBuckets(t *testing.T) {
	t.Parallel()
	for _, b := range [][]float64{{1, 1}, {2, 1}, {0.1, math.NaN()}, {0.1, math.Inf(1)}} {
		if _, err := New(&Options{Buckets: b}); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("buckets %v: got %v", b, err)
		}
	}
}

func TestBuckets(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		opts *Options
		want []float64
	}{
		"default": {nil, defaultBuckets},
		"custom":  {&Options{Buckets: []float64{0.001, 0.1, 60}}, []float64{0.001, 0.1, 60}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, c.opts)
			hooktest.ReportRun(context.Background(), r.tel, inbox.Event{Message: inbox.Message{Type: "t"}, Outcome: idem.Processed, Duration: 30 * time.Millisecond})
			dp := r.histogram(t, "idem.inbox.run.duration{idem.inbox.type=t,idem.outcome=processed}")
			if !slices.Equal(dp.Bounds, c.want) {
				t.Fatalf("bounds %v, want %v", dp.Bounds, c.want)
			}
			if dp.Sum != 0.03 {
				t.Fatalf("sum %v, want 0.03 (seconds)", dp.Sum)
			}
		})
	}
}

// refusingMeter fails to create counters, as a misconfigured provider may.
type refusingMeter struct{ noop.Meter }

func (refusingMeter) Int64Counter(string, ...metric.Int64CounterOption) (metric.Int64Counter, error) {
	return noop.Int64Counter{}, errors.New("counter refused")
}

type refusingProvider struct{ noop.MeterProvider }

func (refusingProvider) Meter(string, ...metric.MeterOption) metric.Meter { return refusingMeter{} }

func TestNewReportsInstrumentErrors(t *testing.T) {
	t.Parallel()
	_, err := New(&Options{MeterProvider: refusingProvider{}})
	if err == nil || !strings.HasPrefix(err.Error(), "idemotel: creating instruments: ") || !strings.Contains(err.Error(), "counter refused") {
		t.Fatalf("got %v", err)
	}
}

// TestNilOptionsUseGlobals is not parallel: it sets the otel globals. No
// other test reads them.
func TestNilOptionsUseGlobals(t *testing.T) {
	// The globals are set first: otel's forwarding from a New that ran
	// before happens only for the first provider set, so it would not
	// survive -count=2.
	reader, spans := sdkmetric.NewManualReader(), tracetest.NewSpanRecorder()
	otel.SetMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)))
	tel, err := New(nil)
	if err != nil {
		t.Fatal(err)
	}
	hooktest.ReportDelivery(context.Background(), tel, consume.Event{Consumer: "c", Outcome: idem.Processed})
	r := &rig{tel: tel, reader: reader, spans: spans}
	hooktest.WantCounts(t, r.points(t), map[string]float64{
		"idem.consumer.deliveries{idem.consumer=c,idem.outcome=processed}": 1,
	})
	if n := len(r.ended("idem.consume")); n != 1 {
		t.Fatalf("%d spans through the global tracer provider", n)
	}
}

// eventLog is a consume hook that keeps the events, to compare the spans
// with what the engine reported.
type eventLog struct {
	mu     sync.Mutex
	events []consume.Event
}

func (l *eventLog) OnDeliveryEnd(_ context.Context, ev consume.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, ev)
}

func TestConsumeHooksWithRealEngine(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	log := &eventLog{}
	hooks := []idem.Hook{r.tel, log}

	// The broker adapter's span, which the delivery spans must sit under.
	ctx, broker := r.tp.Tracer("broker").Start(context.Background(), "broker process")
	before := time.Now()
	// payments: processed, duplicate, processed, dead-lettered (no id);
	// refunds: retried twice, then dead-lettered. The refunds error
	// quotes customer-secret.
	hooktest.DriveConsume(t, ctx, hooks)
	after := time.Now()
	broker.End()

	c := func(consumer, outcome string) string {
		return "idem.consumer.deliveries{idem.consumer=" + consumer + ",idem.outcome=" + outcome + "}"
	}
	got := r.points(t)
	hooktest.WantCounts(t, got, map[string]float64{
		c("payments", "processed"): 2, c("payments", "duplicate"): 1, c("payments", "dead_lettered"): 1,
		c("payments", "retried"): 0, c("payments", "requeued"): 0, c("payments", "abandoned"): 0,
		c("refunds", "retried"): 2, c("refunds", "dead_lettered"): 1, c("refunds", "processed"): 0,
		"idem.consumer.handle.duration{idem.consumer=payments,idem.outcome=processed}":           2,
		"idem.consumer.handle.duration{idem.consumer=refunds,idem.outcome=retried}":              2,
		"idem.consumer.dead_letters{idem.consumer=payments,idem.dead_letter.reason=missing_id}":  1,
		"idem.consumer.dead_letters{idem.consumer=refunds,idem.dead_letter.reason=max_attempts}": 1,
		"idem.consumer.infrastructure_retries{idem.consumer=refunds}":                            0,
	})
	if _, ok := got["idem.consumer.handle.duration{idem.consumer=payments,idem.outcome=retried}"]; ok {
		t.Error("a histogram point for an outcome that never happened")
	}
	r.noLeaks(t, "secret")

	spans := r.ended("idem.consume")
	if len(spans) != len(log.events) || len(spans) != 7 {
		t.Fatalf("%d spans for %d events", len(spans), len(log.events))
	}
	wantStatus := map[string]codes.Code{
		"processed": codes.Unset, "duplicate": codes.Unset, "retried": codes.Error, "dead_lettered": codes.Error,
	}
	for i, s := range spans {
		ev := log.events[i]
		a := attrsOf(s)
		if s.SpanKind() != trace.SpanKindConsumer {
			t.Errorf("span %d kind %v", i, s.SpanKind())
		}
		childOf(t, fmt.Sprintf("span %d", i), s, broker.SpanContext())
		if a[attrOutcome].AsString() != ev.Outcome.String() || a[attrConsumer].AsString() != ev.Consumer ||
			a[attrAttempt].AsInt64() != int64(ev.Attempt) || a["messaging.operation.type"].AsString() != "process" {
			t.Errorf("span %d attributes %v for event %+v", i, a, ev)
		}
		if id, ok := a["messaging.message.id"]; (ev.ID != "") != ok || id.AsString() != ev.ID {
			t.Errorf("span %d message id %v, want %q", i, id, ev.ID)
		}
		if _, ok := a[attrKey]; ok {
			t.Errorf("span %d records the key without RecordKeys", i)
		}
		if want := wantStatus[ev.Outcome.String()]; s.Status().Code != want {
			t.Errorf("span %d (%v) status %v, want %v", i, ev.Outcome, s.Status(), want)
		}
		wantWithin(t, s, before, after)
	}
	// The delivery without an id: dead-lettered before any handler ran, so
	// no error, only the reason.
	if s := spans[3]; str(s, attrReason) != string(idem.DeadMissingID) || s.Status().Description != "dead_lettered: missing_id" ||
		str(s, "error.type") != "_OTHER" {
		t.Errorf("missing id span: %v %v", attrsOf(s), s.Status())
	}
	// A retry: delay and an exception event with the error's type only.
	if s := spans[4]; attrsOf(s)[attrRetryDelay].AsFloat64() != log.events[4].Delay.Seconds() ||
		attrsOf(s)[attrInfrastructure].AsBool() || str(s, "error.type") != "*errors.errorString" ||
		s.Status().Description != "retried" || exception(s)["exception.type"] != "*errors.errorString" {
		t.Errorf("retried span: %v %v %v", attrsOf(s), s.Status(), s.Events())
	}
	spanLeaks(t, spans, "customer-secret")

	// Duration histograms are in seconds and add up to the reported times.
	var sum float64
	for _, ev := range log.events[:3] {
		if ev.Outcome == idem.Processed {
			sum += ev.Duration.Seconds()
		}
	}
	if dp := r.histogram(t, "idem.consumer.handle.duration{idem.consumer=payments,idem.outcome=processed}"); math.Abs(dp.Sum-sum) > 1e-9 {
		t.Errorf("histogram sum %v, want %v", dp.Sum, sum)
	}
}

func TestMeasurementsCarryTheSpanAsExemplar(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	// The SDK's default filter, set explicitly so that
	// OTEL_METRICS_EXEMPLAR_FILTER in the environment cannot change it.
	r.reader = sdkmetric.NewManualReader()
	tel, err := New(&Options{
		MeterProvider:  sdkmetric.NewMeterProvider(sdkmetric.WithReader(r.reader), sdkmetric.WithExemplarFilter(exemplar.TraceBasedFilter)),
		TracerProvider: r.tp,
	})
	if err != nil {
		t.Fatal(err)
	}
	hooktest.ReportDelivery(context.Background(), tel, consume.Event{Consumer: "c", Outcome: idem.Processed, Duration: time.Millisecond})
	span := r.ended("idem.consume")[0].SpanContext()
	found := false
	for _, sm := range r.collect(t).ScopeMetrics {
		for _, m := range sm.Metrics {
			if d, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "idem.consumer.deliveries" {
				for _, dp := range d.DataPoints {
					for _, ex := range dp.Exemplars {
						found = true
						if trace.SpanID(ex.SpanID) != span.SpanID() || trace.TraceID(ex.TraceID) != span.TraceID() {
							t.Errorf("exemplar %x/%x, want the delivery span %v", ex.TraceID, ex.SpanID, span)
						}
					}
				}
			}
		}
	}
	if !found {
		t.Fatal("no exemplar on the delivery counter")
	}
}

func TestConsumeInfrastructureRetry(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	e := hooktest.NewEngine(t, []idem.Hook{r.tel}, "ledger", func(context.Context, idem.Run, consume.Delivery) error {
		return idem.Retryable(errors.New("connection refused"))
	})
	hooktest.Handle(t, context.Background(), e, hooktest.NewDelivery("m1", "x"), idem.Retried)
	hooktest.WantCounts(t, r.points(t), map[string]float64{
		"idem.consumer.infrastructure_retries{idem.consumer=ledger}":          1,
		"idem.consumer.deliveries{idem.consumer=ledger,idem.outcome=retried}": 1,
	})
	s := r.ended("idem.consume")[0]
	if !attrsOf(s)[attrInfrastructure].AsBool() || s.Status().Code != codes.Error {
		t.Fatalf("span %v %v", attrsOf(s), s.Status())
	}
	// A span without a parent in the context is a root.
	if s.Parent().IsValid() {
		t.Fatalf("parent %v from a context without a span", s.Parent())
	}
}

func TestConsumeUnknownValuesAreOther(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	ctx := context.Background()
	hooktest.ReportDelivery(ctx, r.tel, consume.Event{Consumer: "c", Outcome: "brand_new"})
	hooktest.ReportDelivery(ctx, r.tel, consume.Event{Consumer: "c", Outcome: idem.DeadLettered, Reason: "something new"})
	hooktest.ReportDelivery(ctx, r.tel, consume.Event{Consumer: "\xff", Outcome: idem.Processed})
	hooktest.ReportDelivery(ctx, r.tel, consume.Event{Consumer: "", Outcome: idem.Processed})
	hooktest.WantCounts(t, r.points(t), map[string]float64{
		"idem.consumer.deliveries{idem.consumer=c,idem.outcome=other}":                     1,
		"idem.consumer.dead_letters{idem.consumer=c,idem.dead_letter.reason=other}":        1,
		"idem.consumer.deliveries{idem.consumer=other,idem.outcome=processed}":             2,
		"idem.consumer.dead_letters{idem.consumer=c,idem.dead_letter.reason=max_attempts}": 0,
	})
	// The span keeps the reason as reported, made valid UTF-8.
	spans := r.ended("idem.consume")
	if got := str(spans[1], attrReason); got != "something new" {
		t.Errorf("reason %q", got)
	}
	if got := str(spans[2], attrConsumer); got != "\uFFFD" {
		t.Errorf("consumer %q", got)
	}
}

func TestConsumeStatusMapping(t *testing.T) {
	t.Parallel()
	ackErr := errors.New("consume: ack: channel closed")
	for _, c := range []struct {
		name string
		ev   consume.Event
		want codes.Code
	}{
		{"processed", consume.Event{Outcome: idem.Processed}, codes.Unset},
		{"processed, ack failed", consume.Event{Outcome: idem.Processed, Err: ackErr}, codes.Error},
		{"duplicate", consume.Event{Outcome: idem.Duplicate}, codes.Unset},
		{"retried", consume.Event{Outcome: idem.Retried, Err: errors.New("x")}, codes.Error},
		{"dead-lettered", consume.Event{Outcome: idem.DeadLettered, Reason: idem.DeadPermanent, Err: retry.Permanent(errors.New("x"))}, codes.Error},
		{"requeued", consume.Event{Outcome: idem.Requeued, Err: idem.ErrCommitUnknown}, codes.Error},
		{"abandoned", consume.Event{Outcome: idem.Abandoned, Err: context.Canceled}, codes.Unset},
		{"panicked", consume.Event{Outcome: idem.Panicked}, codes.Error},
		{"unknown", consume.Event{Outcome: "brand_new"}, codes.Unset},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, nil)
			c.ev.Consumer = "c"
			hooktest.ReportDelivery(context.Background(), r.tel, c.ev)
			s := r.ended("idem.consume")[0]
			if s.Status().Code != c.want {
				t.Fatalf("status %v, want %v", s.Status(), c.want)
			}
			_, hasType := attrsOf(s)["error.type"]
			if hasType != (c.want == codes.Error) {
				t.Errorf("error.type present %v with status %v", hasType, s.Status())
			}
			if (exception(s) != nil) != (c.ev.Err != nil) {
				t.Errorf("exception event %v for error %v", exception(s), c.ev.Err)
			}
		})
	}
}

// typedError names its class for error.type.
type typedError struct{}

func (typedError) Error() string     { return "card declined for alice@example.com" }
func (typedError) ErrorType() string { return "card_declined" }

func TestErrorMessagesAreOptIn(t *testing.T) {
	t.Parallel()
	err := fmt.Errorf("charging: %w", typedError{})
	for _, record := range []bool{false, true} {
		t.Run(fmt.Sprint(record), func(t *testing.T) {
			t.Parallel()
			r := newRig(t, &Options{RecordErrorMessages: record})
			ctx := context.Background()
			hooktest.ReportDelivery(ctx, r.tel, consume.Event{Consumer: "c", Outcome: idem.Retried, Err: err})
			hooktest.ReportRun(ctx, r.tel, inbox.Event{Message: inbox.Message{Type: "t"}, Outcome: idem.DeadLettered, Err: err})
			hooktest.ReportRequest(ctx, r.tel, idemhttp.Event{Outcome: idem.Errored, Status: 503, Err: err})
			hooktest.ReportDo(ctx, r.tel, idem.DoEvent{Outcome: idem.Errored, Err: err})
			for _, s := range r.spans.Ended() {
				ex := exception(s)
				if str(s, "error.type") != "card_declined" || ex["exception.type"] != "card_declined" {
					t.Errorf("%s: error.type %q, exception %v", s.Name(), str(s, "error.type"), ex)
				}
				if record {
					if s.Status().Description != err.Error() || ex["exception.message"] != err.Error() {
						t.Errorf("%s: status %v, exception %v", s.Name(), s.Status(), ex)
					}
				} else {
					spanLeaks(t, []sdktrace.ReadOnlySpan{s}, "alice")
					if _, ok := ex["exception.message"]; ok || s.Status().Code != codes.Error {
						t.Errorf("%s: status %v, exception %v", s.Name(), s.Status(), ex)
					}
				}
			}
		})
	}
}

func TestConsumersAreCreatedAtZero(t *testing.T) {
	t.Parallel()
	r := newRig(t, &Options{Consumers: []string{"payments"}})
	hooktest.WantCounts(t, r.points(t), map[string]float64{
		"idem.consumer.deliveries{idem.consumer=payments,idem.outcome=dead_lettered}":             0,
		"idem.consumer.deliveries{idem.consumer=payments,idem.outcome=processed}":                 0,
		"idem.consumer.dead_letters{idem.consumer=payments,idem.dead_letter.reason=max_attempts}": 0,
		"idem.consumer.infrastructure_retries{idem.consumer=payments}":                            0,
	})
}

func TestMaxLabelValuesBoundsConsumers(t *testing.T) {
	t.Parallel()
	r := newRig(t, &Options{MaxLabelValues: 2})
	for _, c := range []string{"a", "b", "c", "d", "a"} {
		hooktest.ReportDelivery(context.Background(), r.tel, consume.Event{Consumer: c, Outcome: idem.Processed})
	}
	got := r.points(t)
	hooktest.WantCounts(t, got, map[string]float64{
		"idem.consumer.deliveries{idem.consumer=a,idem.outcome=processed}":     2,
		"idem.consumer.deliveries{idem.consumer=b,idem.outcome=processed}":     1,
		"idem.consumer.deliveries{idem.consumer=other,idem.outcome=processed}": 2,
	})
	for k := range got {
		if strings.Contains(k, "idem.consumer=c") || strings.Contains(k, "idem.consumer=d") {
			t.Errorf("unbounded series %s", k)
		}
	}
	// Spans are not bounded.
	if got := str(r.ended("idem.consume")[3], attrConsumer); got != "d" {
		t.Errorf("span consumer %q", got)
	}
}

func TestInboxHookWithRealWorker(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	var events []inbox.Event
	w := hooktest.NewWorker(t, []idem.Hook{r.tel, runEnd(func(_ context.Context, ev inbox.Event) { events = append(events, ev) })})
	// The worker's span, which the run spans must sit under.
	ctx, worker := r.tp.Tracer("app").Start(context.Background(), "inbox worker")
	before := time.Now()
	if n, err := w.RunOnce(ctx); err != nil || n != 6 {
		t.Fatalf("RunOnce: %d, %v", n, err)
	}
	after := time.Now()
	worker.End()

	wantOutcomes := []string{"processed", "retried", "dead_lettered", "lease_lost", "dead_lettered", "dead_lettered"}
	var got []string
	for _, ev := range events {
		got = append(got, ev.Outcome.String())
	}
	if !slices.Equal(got, wantOutcomes) {
		t.Fatalf("worker reported %v, want %v", got, wantOutcomes)
	}
	run := func(typ, outcome string) string {
		return "idem.inbox.runs{idem.inbox.type=" + typ + ",idem.outcome=" + outcome + "}"
	}
	hooktest.WantCounts(t, r.points(t), map[string]float64{
		run("order.created", "processed"):       1,
		run("order.created", "lease_lost"):      1,
		run("order.failing", "retried"):         1,
		run("order.failing", "dead_lettered"):   1,
		run("order.permanent", "dead_lettered"): 1,
		run("order.unknown", "dead_lettered"):   1,
		"idem.inbox.dead_letters{idem.dead_letter.reason=max_attempts,idem.inbox.type=order.failing}": 1,
		"idem.inbox.dead_letters{idem.dead_letter.reason=permanent,idem.inbox.type=order.permanent}":  1,
		"idem.inbox.dead_letters{idem.dead_letter.reason=no_handler,idem.inbox.type=order.unknown}":   1,
		"idem.inbox.run.duration{idem.inbox.type=order.failing,idem.outcome=dead_lettered}":           1,
	})
	r.noLeaks(t, "secret", "msg-")

	spans := r.ended("idem.inbox")
	if len(spans) != len(events) {
		t.Fatalf("%d spans for %d events", len(spans), len(events))
	}
	for i, s := range spans {
		ev := events[i]
		a := attrsOf(s)
		if s.SpanKind() != trace.SpanKindConsumer {
			t.Errorf("span %d: kind %v", i, s.SpanKind())
		}
		childOf(t, fmt.Sprintf("span %d", i), s, worker.SpanContext())
		if a["messaging.message.id"].AsString() != ev.Message.ID || a[attrInboxSource].AsString() != "orders" ||
			a[attrInboxType].AsString() != ev.Message.Type || a[attrAttempt].AsInt64() != int64(ev.Message.Attempt) ||
			a[attrOutcome].AsString() != ev.Outcome.String() {
			t.Errorf("span %d attributes %v for %+v", i, a, ev)
		}
		if want := ev.Outcome != idem.Processed; (s.Status().Code == codes.Error) != want {
			t.Errorf("span %d (%v): status %v", i, ev.Outcome, s.Status())
		}
		if got := a[attrReason].AsString(); got != string(ev.DeadReason) {
			t.Errorf("span %d reason %q, want %q", i, got, ev.DeadReason)
		}
		wantWithin(t, s, before, after)
	}
	if got := attrsOf(spans[5])[attrAttempt].AsInt64(); got != 3 {
		t.Errorf("third attempt reported as %d", got)
	}
	if got := spans[4].Status().Description; got != "dead_lettered: no_handler" {
		t.Errorf("no handler span status %q", got)
	}
	spanLeaks(t, spans, "customer-secret")
}

func TestInboxHook(t *testing.T) {
	t.Parallel()
	r := newRig(t, &Options{MaxLabelValues: 3})
	// The released row did not run, and the lease was lost before the
	// run: neither is timed.
	hooktest.DriveInbox(context.Background(), []idem.Hook{r.tel})

	got := r.points(t)
	run := func(typ, outcome string) string {
		return "idem.inbox.runs{idem.inbox.type=" + typ + ",idem.outcome=" + outcome + "}"
	}
	dur := func(typ, outcome string) string {
		return "idem.inbox.run.duration{idem.inbox.type=" + typ + ",idem.outcome=" + outcome + "}"
	}
	hooktest.WantCounts(t, got, map[string]float64{
		run("order.created", "processed"): 2, run("order.created", "retried"): 1,
		run("order.paid", "dead_lettered"): 1, run("order.paid", "released"): 1, run("order.paid", "other"): 1,
		run("order.shipped", "lease_lost"): 1, run("other", "processed"): 2,
		dur("order.created", "processed"): 2, dur("order.paid", "dead_lettered"): 1,
		"idem.inbox.dead_letters{idem.dead_letter.reason=max_attempts,idem.inbox.type=order.paid}": 1,
	})
	for _, k := range []string{dur("order.paid", "released"), dur("order.shipped", "lease_lost")} {
		if _, ok := got[k]; ok {
			t.Errorf("%s timed a run that did not execute", k)
		}
	}
	r.noLeaks(t, "secret")

	spans := r.ended("idem.inbox")
	wantStatus := []codes.Code{codes.Unset, codes.Unset, codes.Error, codes.Error, codes.Unset, codes.Unset, codes.Error, codes.Unset, codes.Unset}
	for i, s := range spans {
		if s.Status().Code != wantStatus[i] {
			t.Errorf("span %d (%s): status %v, want %v", i, str(s, attrOutcome), s.Status(), wantStatus[i])
		}
	}
	// Spans are not bounded.
	if got := str(spans[8], attrInboxType); got != "spam.2" {
		t.Errorf("span type %q", got)
	}
	spanLeaks(t, spans, "customer-secret")
}

func TestInboxStatusMapping(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		ev   inbox.Event
		want codes.Code
	}{
		{inbox.Event{Outcome: idem.Processed}, codes.Unset},
		{inbox.Event{Outcome: idem.Retried, Err: errors.New("x")}, codes.Error},
		{inbox.Event{Outcome: idem.DeadLettered, DeadReason: idem.DeadMaxAttempts}, codes.Error},
		{inbox.Event{Outcome: idem.LeaseLost}, codes.Error},
		{inbox.Event{Outcome: idem.Released}, codes.Unset},
		{inbox.Event{Outcome: idem.Panicked}, codes.Error},
		{inbox.Event{Outcome: idem.Abandoned, Err: context.Canceled}, codes.Unset},
		{inbox.Event{Outcome: "brand_new"}, codes.Unset},
		{inbox.Event{Outcome: "brand_new", Err: errors.New("x")}, codes.Error},
	} {
		t.Run(fmt.Sprintf("%v %v", c.ev.Outcome, c.ev.Err != nil), func(t *testing.T) {
			t.Parallel()
			r := newRig(t, nil)
			c.ev.Message.Type = "t"
			hooktest.ReportRun(context.Background(), r.tel, c.ev)
			s := r.ended("idem.inbox")[0]
			if s.Status().Code != c.want {
				t.Fatalf("status %v, want %v", s.Status(), c.want)
			}
			if _, ok := attrsOf(s)["error.type"]; ok != (c.want == codes.Error) {
				t.Errorf("error.type present %v with status %v", ok, s.Status())
			}
		})
	}
}

// serveIdem runs the real idemhttp middleware under a ServeMux pattern
// (hooktest.ServeIdem), inside a server span as otelhttp would start it.
func serveIdem(t *testing.T, r *rig) (http.Handler, *[]trace.SpanContext) {
	t.Helper()
	mux := hooktest.ServeIdem(t, []idem.Hook{r.tel})
	var servers []trace.SpanContext
	tracer := r.tp.Tracer("server")
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		ctx, span := tracer.Start(req.Context(), "POST", trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
		servers = append(servers, span.SpanContext())
		mux.ServeHTTP(w, req.WithContext(ctx))
	}), &servers
}

func TestHTTPHookWithRealMiddleware(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	h, servers := serveIdem(t, r)
	before := time.Now()
	hooktest.DriveHTTP(t, h)
	after := time.Now()

	req := func(outcome, class string) string {
		return "idem.http.requests{idem.http.status_class=" + class + ",idem.outcome=" + outcome + "}"
	}
	got := r.points(t)
	want := map[string]float64{
		req("processed", "2xx"): 1, req("duplicate", "2xx"): 1, req("mismatch", "4xx"): 1,
		req("rejected", "4xx"): 1, req("released", "5xx"): 1,
		"idem.http.request.duration{idem.outcome=processed}": 1,
		"idem.http.request.duration{idem.outcome=duplicate}": 1,
	}
	hooktest.WantCounts(t, got, want)
	for k := range got {
		if strings.HasPrefix(k, "idem.http.requests{") && want[k] == 0 {
			t.Errorf("unexpected series %s", k)
		}
	}
	r.noLeaks(t, "secret", "/accounts/", "http.route")

	spans := r.ended("idem.http")
	if len(spans) != 5 || len(*servers) != 5 {
		t.Fatalf("%d spans, %d server spans", len(spans), len(*servers))
	}
	type want1 struct {
		outcome string
		status  int64
		code    codes.Code
	}
	wants := []want1{
		{"processed", 201, codes.Unset}, {"duplicate", 201, codes.Unset}, {"mismatch", 422, codes.Unset},
		{"rejected", 400, codes.Unset}, {"released", 503, codes.Error},
	}
	for i, s := range spans {
		a := attrsOf(s)
		w := wants[i]
		if s.SpanKind() != trace.SpanKindInternal {
			t.Errorf("span %d kind %v", i, s.SpanKind())
		}
		childOf(t, fmt.Sprintf("span %d", i), s, (*servers)[i])
		if a[attrOutcome].AsString() != w.outcome || a["http.response.status_code"].AsInt64() != w.status || s.Status().Code != w.code {
			t.Errorf("span %d: %v %v, want %+v", i, a, s.Status(), w)
		}
		if a["http.route"].AsString() != "/accounts/{account}/payments" {
			t.Errorf("span %d route %v", i, a["http.route"])
		}
		if _, ok := a[attrKey]; ok {
			t.Errorf("span %d records the key without RecordKeys", i)
		}
		if w.outcome != "rejected" && len(a[attrScopeHash].AsString()) != 16 {
			t.Errorf("span %d scope hash %v", i, a[attrScopeHash])
		}
		if s.EndTime().Before(before) || s.EndTime().After(after) || !s.StartTime().Before(s.EndTime()) {
			t.Errorf("span %d from %v to %v, outside [%v, %v]", i, s.StartTime(), s.EndTime(), before, after)
		}
	}
	if s := spans[4]; str(s, "error.type") != "503" || s.Status().Description != "released: 503" {
		t.Errorf("released span: %v %v", attrsOf(s), s.Status())
	}
	spanLeaks(t, spans, "secret", "/accounts/acct")

	// The middleware's Guard has the same hooks: each request that reached
	// it (all but the rejected one) has a Guard span under its HTTP span,
	// with the same scope hash.
	guards := r.ended("idem.guard")
	if len(guards) != 4 {
		t.Fatalf("%d Guard spans, want 4", len(guards))
	}
	for i, want := range []int{0, 1, 2, 4} {
		g := guards[i]
		childOf(t, fmt.Sprintf("guard span %d", i), g, spans[want].SpanContext())
		if str(g, attrOutcome) != wants[want].outcome || str(g, attrScopeHash) != str(spans[want], attrScopeHash) {
			t.Errorf("guard span %d: %v", i, attrsOf(g))
		}
	}
}

// The spans nest as the work does: otelhttp's server span, idemhttp's
// request span, the Guard's span, and the spans the handler starts.
func TestHTTPSpansAreTheParentsOfTheHandlers(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	tracer := r.tp.Tracer("app")
	var handler trace.SpanContext
	mw, err := idemhttp.New(idemtest.NewMemoryStore(nil), &idemhttp.Config{
		SharedScope: true, AllowNonDurable: true, Logger: hooktest.Quiet,
		Hooks: []idem.Hook{r.tel.For("api")},
	})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		_, span := tracer.Start(req.Context(), "charge card")
		handler = span.SpanContext()
		span.End()
		w.WriteHeader(http.StatusCreated)
	}))
	ctx, server := tracer.Start(context.Background(), "POST", trace.WithSpanKind(trace.SpanKindServer))
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/pay", strings.NewReader("{}"))
	req.Header.Set("Idempotency-Key", `"k1"`)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	server.End()
	if w.Code != http.StatusCreated {
		t.Fatalf("status %d", w.Code)
	}
	httpSpan, guard := r.ended("idem.http"), r.ended("idem.guard")
	if len(httpSpan) != 1 || len(guard) != 1 {
		t.Fatalf("%d http spans, %d guard spans", len(httpSpan), len(guard))
	}
	childOf(t, "http span", httpSpan[0], server.SpanContext())
	childOf(t, "guard span", guard[0], httpSpan[0].SpanContext())
	work := r.byID(t, "the handler's span", handler)
	childOf(t, "handler span", work, guard[0].SpanContext())
	if str(guard[0], attrGuard) != "api" {
		t.Errorf("guard name %q", str(guard[0], attrGuard))
	}
	// Each span covers its children.
	covers(t, httpSpan[0], guard[0])
	covers(t, guard[0], work)
}

// The duration histograms record the duration the component reported.
func TestHTTPDurationIsTheReportedOne(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	hooktest.ReportRequest(context.Background(), r.tel, idemhttp.Event{
		Request: httptest.NewRequest(http.MethodPost, "/", nil), Outcome: idem.Processed, Status: 200, Duration: 1500 * time.Millisecond})
	if dp := r.histogram(t, "idem.http.request.duration{idem.outcome=processed}"); dp.Sum != 1.5 {
		t.Fatalf("sum %v, want 1.5", dp.Sum)
	}
	if _, ok := attrsOf(r.ended("idem.http")[0])["http.route"]; ok {
		t.Fatal("a route without a pattern")
	}
}

func TestHTTPRouteIsOptInAndUsesThePattern(t *testing.T) {
	t.Parallel()
	r := newRig(t, &Options{HTTPRoute: true})
	h, _ := serveIdem(t, r)
	hooktest.DriveHTTP(t, h)
	// A middleware outside any mux sees no pattern.
	ctx := context.Background()
	hooktest.ReportRequest(ctx, r.tel, idemhttp.Event{Request: httptest.NewRequest(http.MethodPut, "/raw-secret", nil), Key: "k", Outcome: idem.Processed, Status: 200})
	hooktest.ReportRequest(ctx, r.tel, idemhttp.Event{Outcome: idem.Processed, Status: 200})
	odd := httptest.NewRequest("BREW", "/", nil)
	odd.Pattern = "example.com/pots/{pot}"
	hooktest.ReportRequest(ctx, r.tel, idemhttp.Event{Request: odd, Outcome: idem.Processed, Status: 200})
	const route = "http.route=/accounts/{account}/payments"
	hooktest.WantCounts(t, r.points(t), map[string]float64{
		"idem.http.requests{http.request.method=POST," + route + ",idem.http.status_class=2xx,idem.outcome=processed}":            1,
		"idem.http.requests{http.request.method=PUT,idem.http.status_class=2xx,idem.outcome=processed}":                           1,
		"idem.http.requests{http.request.method=_OTHER,idem.http.status_class=2xx,idem.outcome=processed}":                        1,
		"idem.http.requests{http.request.method=_OTHER,http.route=/pots/{pot},idem.http.status_class=2xx,idem.outcome=processed}": 1,
		"idem.http.request.duration{http.request.method=POST," + route + ",idem.outcome=mismatch}":                                1,
	})
	r.noLeaks(t, "secret")
}

func TestHTTPRoutesAreBounded(t *testing.T) {
	t.Parallel()
	r := newRig(t, &Options{HTTPRoute: true, MaxLabelValues: 1})
	for _, p := range []string{"POST /a", "POST /b", "POST /a"} {
		req := httptest.NewRequest(http.MethodPost, "/", nil)
		req.Pattern = p
		hooktest.ReportRequest(context.Background(), r.tel, idemhttp.Event{Request: req, Outcome: idem.Processed, Status: 201})
	}
	hooktest.WantCounts(t, r.points(t), map[string]float64{
		"idem.http.requests{http.request.method=POST,http.route=/a,idem.http.status_class=2xx,idem.outcome=processed}":    2,
		"idem.http.requests{http.request.method=POST,http.route=other,idem.http.status_class=2xx,idem.outcome=processed}": 1,
	})
	if got := str(r.ended("idem.http")[1], "http.route"); got != "/b" {
		t.Errorf("span route %q", got)
	}
}

func TestHTTPUnknownValuesAreOther(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	for _, ev := range []idemhttp.Event{
		{Outcome: "brand_new", Status: 200},
		{Outcome: idem.Panicked, Status: 0},
		{Outcome: idem.Errored, Status: 600},
		{Outcome: idem.InProgress, Status: 100},
	} {
		hooktest.ReportRequest(context.Background(), r.tel, ev)
	}
	hooktest.WantCounts(t, r.points(t), map[string]float64{
		"idem.http.requests{idem.http.status_class=2xx,idem.outcome=other}":       1,
		"idem.http.requests{idem.http.status_class=other,idem.outcome=panicked}":  1,
		"idem.http.requests{idem.http.status_class=other,idem.outcome=error}":     1,
		"idem.http.requests{idem.http.status_class=1xx,idem.outcome=in_progress}": 1,
	})
}

func TestHTTPStatusMapping(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		outcome idem.Outcome
		status  int
		err     error
		want    codes.Code
	}{
		{idem.Processed, 201, nil, codes.Unset},
		{idem.Processed, 500, nil, codes.Error}, // a ShouldStore that keeps 5xx
		{idem.Released, 503, nil, codes.Error},
		{idem.Released, 429, nil, codes.Unset},
		{idem.Duplicate, 201, nil, codes.Unset},
		{idem.InProgress, 409, nil, codes.Unset},
		{idem.Mismatch, 422, nil, codes.Unset},
		{idem.Discarded, 410, nil, codes.Unset},
		{idem.Rejected, 400, nil, codes.Unset},
		{idem.Errored, 201, idem.ErrLeaseLost, codes.Error}, // ran, but not recorded
		{idem.Errored, 503, errors.New("store down"), codes.Error},
		{idem.Panicked, 500, nil, codes.Error},
		{idem.Tombstoned, 201, nil, codes.Unset},
		{idem.Canceled, 499, context.Canceled, codes.Unset},
		{idem.NotRecorded, 201, idem.ErrNotRecorded, codes.Error},
		{idem.InDoubt, 502, errors.New("upstream went away"), codes.Error},
	} {
		t.Run(fmt.Sprintf("%s %d", c.outcome, c.status), func(t *testing.T) {
			t.Parallel()
			r := newRig(t, nil)
			hooktest.ReportRequest(context.Background(), r.tel, idemhttp.Event{Outcome: c.outcome, Status: c.status, Err: c.err})
			s := r.ended("idem.http")[0]
			if s.Status().Code != c.want {
				t.Fatalf("status %v, want %v", s.Status(), c.want)
			}
			if (exception(s) != nil) != (c.err != nil) {
				t.Errorf("exception event %v for error %v", exception(s), c.err)
			}
		})
	}
}

// TestGuardHookWithRealGuard drives idem.Guard over a MemoryStore.
func TestGuardHookWithRealGuard(t *testing.T) {
	t.Parallel()
	r := newRig(t, &Options{MaxLabelValues: 1})
	var mu sync.Mutex
	var events []idem.DoEvent
	keep := doEnd(func(_ context.Context, ev idem.DoEvent) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, ev)
	})
	store := idemtest.NewMemoryStore(nil)
	g := hooktest.NewGuard(store, []idem.Hook{r.tel.For("gateway"), keep})
	ctx, caller := r.tp.Tracer("app").Start(context.Background(), "charge")
	before := time.Now()
	hooktest.DriveGuard(t, ctx, g) // executed, replayed, replayed, mismatch, failed
	declined := idem.Final(errors.New("card declined"))
	if _, err := g.Do(ctx, hooktest.Call("secret-key-3", "a"), func(context.Context, idem.Run) ([]byte, error) { return nil, declined }); err == nil {
		t.Fatal("a Final error was not returned")
	}
	if _, err := g.Do(ctx, hooktest.Call("", "a"), hooktest.Charge); err == nil {
		t.Fatal("an empty key was accepted")
	}
	var work trace.SpanContext // a span the panicking function started
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the panic did not go on")
			}
		}()
		g.Do(ctx, hooktest.Call("secret-key-4", "a"), func(ctx context.Context, _ idem.Run) ([]byte, error) {
			_, span := r.tp.Tracer("app").Start(ctx, "work")
			work = span.SpanContext()
			span.End()
			panic("bug")
		})
	}()
	after := time.Now()
	caller.End()
	// A second guard name is past MaxLabelValues: "other" in metrics.
	g2 := hooktest.NewGuard(store, []idem.Hook{r.tel.For("second")})
	if _, err := g2.Do(context.Background(), hooktest.Call("secret-key-5", "a"), hooktest.Charge); err != nil {
		t.Fatal(err)
	}
	hooktest.ReportDo(context.Background(), r.tel.For("gateway"), idem.DoEvent{Outcome: "brand_new"})

	calls := func(guard, outcome string) string {
		return "idem.guard.calls{idem.guard=" + guard + ",idem.outcome=" + outcome + "}"
	}
	hooktest.WantCounts(t, r.points(t), map[string]float64{
		calls("gateway", "processed"): 2, calls("gateway", "duplicate"): 2, calls("gateway", "mismatch"): 1,
		calls("gateway", "released"): 1, calls("gateway", "rejected"): 1, calls("gateway", "panicked"): 1,
		calls("gateway", "other"): 1, calls("other", "processed"): 1,
		"idem.guard.call.duration{idem.guard=gateway,idem.outcome=duplicate}": 2,
	})
	r.noLeaks(t, "secret-scope", "secret-key")

	spans := r.ended("idem.guard")
	if len(spans) != 10 || len(events) != 8 {
		t.Fatalf("%d spans, %d events", len(spans), len(events))
	}
	wantStatus := map[idem.Outcome]codes.Code{
		idem.Processed: codes.Unset, idem.Duplicate: codes.Unset, idem.Mismatch: codes.Unset,
		idem.Rejected: codes.Unset, idem.Released: codes.Error, idem.Panicked: codes.Error,
	}
	h := sha256.Sum256([]byte("secret-scope"))
	wantHash := hex.EncodeToString(h[:8])
	for i, ev := range events {
		s := spans[i]
		a := attrsOf(s)
		if s.SpanKind() != trace.SpanKindInternal {
			t.Errorf("span %d: kind %v", i, s.SpanKind())
		}
		childOf(t, fmt.Sprintf("span %d", i), s, caller.SpanContext())
		if a[attrOutcome].AsString() != string(ev.Outcome) || a[attrGuard].AsString() != "gateway" ||
			a[attrScopeHash].AsString() != wantHash || a[attrToken].AsInt64() != ev.Token {
			t.Errorf("span %d attributes %v for %+v", i, a, ev)
		}
		if want, ok := wantStatus[ev.Outcome]; !ok || s.Status().Code != want {
			t.Errorf("span %d (%s): status %v, want %v", i, ev.Outcome, s.Status(), want)
		}
		if _, ok := a[attrKey]; ok {
			t.Errorf("span %d records the key without RecordKeys", i)
		}
		wantWithin(t, s, before, after)
	}
	// The panic ended the call's span once, and it is the parent of the
	// span the function started.
	if s := spans[7]; events[7].Outcome != idem.Panicked || s.Status().Code != codes.Error {
		t.Errorf("panic span: %v %v", events[7].Outcome, s.Status())
	} else {
		childOf(t, "the function's span", r.byID(t, "the function's span", work), s.SpanContext())
	}
	// The stored Final error is the call's result: an exception event, but
	// not an error span.
	if s := spans[5]; events[5].Outcome != idem.Processed || s.Status().Code != codes.Unset || exception(s) == nil {
		t.Errorf("Final error span: %v %v %v", events[5].Outcome, s.Status(), s.Events())
	}
	if got := str(spans[8], attrGuard); got != "second" {
		t.Errorf("span guard %q", got)
	}
	spanLeaks(t, spans, "secret-scope", "secret-key", "card declined")
}

func TestGuardStatusMapping(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		ev   idem.DoEvent
		want codes.Code
	}{
		{idem.DoEvent{Outcome: idem.Processed}, codes.Unset},
		{idem.DoEvent{Outcome: idem.Duplicate, Err: idem.Final(errors.New("x"))}, codes.Unset},
		{idem.DoEvent{Outcome: idem.InProgress, Err: idem.ErrInProgress}, codes.Unset},
		{idem.DoEvent{Outcome: idem.Mismatch, Err: idem.ErrFingerprintMismatch}, codes.Unset},
		{idem.DoEvent{Outcome: idem.Rejected, Err: idem.ErrInvalidKey}, codes.Unset},
		{idem.DoEvent{Outcome: idem.Released, Err: errors.New("x")}, codes.Error},
		{idem.DoEvent{Outcome: idem.LeaseLost, Err: idem.ErrLeaseLost}, codes.Error},
		{idem.DoEvent{Outcome: idem.NotRecorded, Err: idem.ErrNotRecorded}, codes.Error},
		{idem.DoEvent{Outcome: idem.Panicked}, codes.Error},
		{idem.DoEvent{Outcome: idem.Errored, Err: errors.New("store down")}, codes.Error},
		{idem.DoEvent{Outcome: "brand_new"}, codes.Unset},
		{idem.DoEvent{Outcome: "brand_new", Err: errors.New("x")}, codes.Error},
	} {
		t.Run(fmt.Sprintf("%s %v", c.ev.Outcome, c.ev.Err != nil), func(t *testing.T) {
			t.Parallel()
			r := newRig(t, nil)
			hooktest.ReportDo(context.Background(), r.tel.For("g"), c.ev)
			s := r.ended("idem.guard")[0]
			if s.Status().Code != c.want {
				t.Fatalf("status %v, want %v", s.Status(), c.want)
			}
			if _, ok := attrsOf(s)["error.type"]; ok != (c.want == codes.Error) {
				t.Errorf("error.type present %v with status %v", ok, s.Status())
			}
		})
	}
}

func TestRecordKeys(t *testing.T) {
	t.Parallel()
	r := newRig(t, &Options{RecordKeys: true})
	ctx := context.Background()
	hooktest.ReportDelivery(ctx, r.tel, consume.Event{Consumer: "c", ID: "m1", Key: "order-secret-1", Outcome: idem.Processed})
	hooktest.ReportRun(ctx, r.tel, inbox.Event{Message: inbox.Message{Type: "t", ID: "m2", OrderingKey: "customer-secret"}, Outcome: idem.Processed})
	hooktest.ReportDo(ctx, r.tel.For("g"), idem.DoEvent{Scope: "tenant-secret", Key: "guard-secret-1", Outcome: idem.Processed})
	h, _ := serveIdem(t, r)
	hooktest.Post(t, h, `"key-secret-1"`, `{}`, false)

	if got := str(r.ended("idem.consume")[0], attrKey); got != "order-secret-1" {
		t.Errorf("consume key %q", got)
	}
	if got := str(r.ended("idem.inbox")[0], attrOrderingKey); got != "customer-secret" {
		t.Errorf("inbox ordering key %q", got)
	}
	if s := r.ended("idem.guard")[0]; str(s, attrKey) != "guard-secret-1" || str(s, attrScope) != "tenant-secret" {
		t.Errorf("guard key %q scope %q", str(s, attrKey), str(s, attrScope))
	}
	if got := str(r.ended("idem.http")[0], attrKey); got != "key-secret-1" {
		t.Errorf("http key %q", got)
	}
	r.noLeaks(t, "secret")
}

func TestTraceStringsAreValidAndBounded(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	long := strings.Repeat("é", 1000) // 2000 bytes
	hooktest.ReportDelivery(context.Background(), r.tel, consume.Event{Consumer: "c", ID: "bad\xffid", Outcome: idem.DeadLettered, Reason: idem.DeadInvalidID})
	hooktest.ReportDelivery(context.Background(), r.tel, consume.Event{Consumer: "c", ID: long, Outcome: idem.DeadLettered, Reason: idem.DeadInvalidID})
	spans := r.ended("idem.consume")
	if got := str(spans[0], "messaging.message.id"); got != "bad\uFFFDid" {
		t.Errorf("id %q", got)
	}
	got := str(spans[1], "messaging.message.id")
	if !utf8.ValidString(got) || len(got) > maxTraceString || len(got) < maxTraceString-4 || !strings.HasPrefix(long, got) {
		t.Errorf("long id cut to %d bytes, valid %v", len(got), utf8.ValidString(got))
	}
}

// doEnd and runEnd are end hooks made of functions, to watch what a
// component reports beside the Telemetry.
type (
	doEnd  func(context.Context, idem.DoEvent)
	runEnd func(context.Context, inbox.Event)
)

func (f doEnd) OnDoEnd(ctx context.Context, ev idem.DoEvent)  { f(ctx, ev) }
func (f runEnd) OnRunEnd(ctx context.Context, ev inbox.Event) { f(ctx, ev) }

// component calls one component's start and end hooks on a Telemetry.
type component struct {
	span  string
	start func(*Telemetry, context.Context) context.Context
	end   func(*Telemetry, context.Context)
}

var components = []component{
	{spanConsume,
		func(t *Telemetry, ctx context.Context) context.Context {
			return t.OnDeliveryStart(ctx, consume.Event{Consumer: "c", ID: "m1", Attempt: 1})
		},
		func(t *Telemetry, ctx context.Context) {
			t.OnDeliveryEnd(ctx, consume.Event{Consumer: "c", ID: "m1", Attempt: 1, Outcome: idem.Processed})
		}},
	{spanInbox,
		func(t *Telemetry, ctx context.Context) context.Context {
			return t.OnRunStart(ctx, inbox.Event{Message: inbox.Message{Type: "t", ID: "m1"}})
		},
		func(t *Telemetry, ctx context.Context) {
			t.OnRunEnd(ctx, inbox.Event{Message: inbox.Message{Type: "t", ID: "m1"}, Outcome: idem.Processed})
		}},
	{spanHTTP,
		func(t *Telemetry, ctx context.Context) context.Context {
			return t.OnRequestStart(ctx, idemhttp.Event{ScopeHash: "0123456789abcdef", Key: "k"})
		},
		func(t *Telemetry, ctx context.Context) {
			t.OnRequestEnd(ctx, idemhttp.Event{ScopeHash: "0123456789abcdef", Key: "k", Outcome: idem.Processed, Status: 201})
		}},
	{spanGuard,
		func(t *Telemetry, ctx context.Context) context.Context {
			return t.OnDoStart(ctx, idem.DoEvent{Scope: "s", Key: "k"})
		},
		func(t *Telemetry, ctx context.Context) {
			t.OnDoEnd(ctx, idem.DoEvent{Scope: "s", Key: "k", Outcome: idem.Processed})
		}},
	{spanOutbox,
		func(t *Telemetry, ctx context.Context) context.Context {
			return t.OnPublishStart(ctx, []outbox.Message{{ID: "m1", Topic: "t", Attempt: 1}})
		},
		func(t *Telemetry, ctx context.Context) {
			t.OnPublishEnd(ctx, outbox.Result{Message: outbox.Message{ID: "m1", Topic: "t", Attempt: 1}, Outcome: idem.Processed})
		}},
}

// eachComponent runs test in parallel for each component, with a rig of
// its own.
func eachComponent(t *testing.T, test func(t *testing.T, c component, r *rig)) {
	for _, c := range components {
		t.Run(c.span, func(t *testing.T) {
			t.Parallel()
			test(t, c, newRig(t, nil))
		})
	}
}

// covers fails t unless parent's extent covers child's.
func covers(t *testing.T, parent, child sdktrace.ReadOnlySpan) {
	t.Helper()
	if child.StartTime().Before(parent.StartTime()) || child.EndTime().After(parent.EndTime()) {
		t.Errorf("%s [%v, %v] does not cover %s [%v, %v]", parent.Name(), parent.StartTime(), parent.EndTime(),
			child.Name(), child.StartTime(), child.EndTime())
	}
}

// Each start hook starts a real span: a child of the span in its context,
// the parent of the spans the work starts with the context it returns, and
// ended once, by the end hook, after the work's.
func TestStartHooksNestSpans(t *testing.T) {
	t.Parallel()
	eachComponent(t, func(t *testing.T, c component, r *rig) {
		tracer := r.tp.Tracer("app")
		ctx, caller := tracer.Start(context.Background(), "caller")
		ctx = c.start(r.tel, ctx)
		if n := len(r.ended(c.span)); n != 0 {
			t.Fatalf("%d spans ended by the start hook", n)
		}
		hookSpan := trace.SpanFromContext(ctx).SpanContext()
		_, work := tracer.Start(ctx, "work")
		work.End()
		c.end(r.tel, ctx)
		caller.End()

		spans := r.ended(c.span)
		if len(spans) != 1 {
			t.Fatalf("%d %s spans", len(spans), c.span)
		}
		s := spans[0]
		if s.SpanContext().SpanID() != hookSpan.SpanID() {
			t.Fatal("the start hook's context does not hold its span")
		}
		childOf(t, "hook span", s, caller.SpanContext())
		w := r.ended("work")[0]
		childOf(t, "work span", w, s.SpanContext())
		covers(t, s, w)
		if str(s, attrOutcome) != "processed" {
			t.Errorf("outcome %q", str(s, attrOutcome))
		}
	})
}

// Two Telemetry values in one component's hooks (a For each) thread the
// context as the component does: each end hook ends its own span, though
// the context it gets holds the other's.
func TestEndFindsItsOwnSpan(t *testing.T) {
	t.Parallel()
	eachComponent(t, func(t *testing.T, c component, r *rig) {
		a, b := r.tel.For("a"), r.tel.For("b")
		ctx := c.start(b, c.start(a, context.Background()))
		c.end(a, ctx)
		c.end(b, ctx)
		spans := r.ended(c.span)
		if len(spans) != 2 {
			t.Fatalf("%d spans", len(spans))
		}
		// a ended first (its end hook ran first), and b's span is a's
		// child, as b's start hook ran in a's context.
		childOf(t, "second span", spans[1], spans[0].SpanContext())
		if c.span == spanGuard && (str(spans[0], attrGuard) != "a" || str(spans[1], attrGuard) != "b") {
			t.Errorf("guards %q, %q", str(spans[0], attrGuard), str(spans[1], attrGuard))
		}
	})
}

// An end hook whose start hook did not run (a component calling only end
// hooks) still reports: a span of no length, a child of its context.
func TestEndWithoutStart(t *testing.T) {
	t.Parallel()
	eachComponent(t, func(t *testing.T, c component, r *rig) {
		ctx, caller := r.tp.Tracer("app").Start(context.Background(), "caller")
		c.end(r.tel, ctx)
		caller.End()
		spans := r.ended(c.span)
		if len(spans) != 1 {
			t.Fatalf("%d spans", len(spans))
		}
		childOf(t, "span", spans[0], caller.SpanContext())
		if n := len(r.points(t)); n == 0 {
			t.Error("no measurement")
		}
	})
}

// A nil context is taken for context.Background, as components never pass
// one but a hand-written caller might.
func TestNilContext(t *testing.T) {
	t.Parallel()
	var nilCtx context.Context
	for _, c := range components {
		r := newRig(t, nil)
		c.end(r.tel, c.start(r.tel, nilCtx))
		if n := len(r.ended(c.span)); n != 1 {
			t.Errorf("%s: %d spans", c.span, n)
		}
	}
}

// panickyAck is a delivery whose Ack panics (a broker client's bug).
type panickyAck struct{ *hooktest.Delivery }

func (panickyAck) Ack(context.Context) error { panic("ack bug") }

// With the real engine, the delivery's span is the parent of the
// handler's; a panic ends it once, as an error, before the panic goes on.
func TestConsumeSpanIsTheParentOfTheHandlers(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	tracer := r.tp.Tracer("app")
	e := hooktest.NewEngine(t, []idem.Hook{r.tel}, "payments", func(ctx context.Context, _ idem.Run, d consume.Delivery) error {
		_, span := tracer.Start(ctx, "handler "+d.ID())
		span.End()
		return nil
	})
	ctx, broker := tracer.Start(context.Background(), "broker process")
	hooktest.Handle(t, ctx, e, hooktest.NewDelivery("m1", "a"), idem.Processed)
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the panic did not go on")
			}
		}()
		e.Handle(ctx, panickyAck{hooktest.NewDelivery("m2", "b")})
	}()
	broker.End()

	spans := r.ended(spanConsume)
	if len(spans) != 2 {
		t.Fatalf("%d delivery spans, want 2", len(spans))
	}
	for i, id := range []string{"m1", "m2"} {
		s := spans[i]
		childOf(t, "delivery "+id, s, broker.SpanContext())
		h := r.ended("handler " + id)
		if len(h) != 1 {
			t.Fatalf("%d handler spans for %s", len(h), id)
		}
		childOf(t, "handler "+id, h[0], s.SpanContext())
	}
	if s := spans[1]; str(s, attrOutcome) != "panicked" || s.Status().Code != codes.Error {
		t.Errorf("panicked delivery: %v %v", attrsOf(s), s.Status())
	}
	hooktest.WantCounts(t, r.points(t), map[string]float64{
		"idem.consumer.deliveries{idem.consumer=payments,idem.outcome=processed}": 1,
		"idem.consumer.deliveries{idem.consumer=payments,idem.outcome=panicked}":  1,
	})
}

func TestConcurrentHooks(t *testing.T) {
	t.Parallel()
	r := newRig(t, &Options{MaxLabelValues: 8, HTTPRoute: true})
	const goroutines, each = 48, 20
	// Half of the 16 consumer names and routes are beyond the bound.
	hooktest.ReportConcurrently(goroutines, each, func(name string) idem.Hook { return r.tel.For(name) })
	var deliveries, runs, requests, guardCalls float64
	consumers, routes := map[string]bool{}, map[string]bool{}
	for k, v := range r.points(t) {
		switch {
		case strings.HasPrefix(k, "idem.consumer.deliveries{"):
			deliveries += v
			consumers[strings.SplitN(strings.TrimPrefix(k, "idem.consumer.deliveries{idem.consumer="), ",", 2)[0]] = true
		case strings.HasPrefix(k, "idem.inbox.runs{"):
			runs += v
		case strings.HasPrefix(k, "idem.guard.calls{"):
			guardCalls += v
		case strings.HasPrefix(k, "idem.http.requests{"):
			requests += v
			routes[strings.SplitN(strings.SplitN(k, "http.route=", 2)[1], ",", 2)[0]] = true
		}
	}
	if want := float64(goroutines * each); deliveries != want || runs != want || requests != want || guardCalls != want {
		t.Fatalf("deliveries %v runs %v requests %v guard calls %v, want %v each", deliveries, runs, requests, guardCalls, want)
	}
	if len(consumers) != 9 || !consumers[Other] || len(routes) != 9 || !routes[Other] {
		t.Fatalf("consumer values %v, routes %v, want 8 each and other", consumers, routes)
	}
	if n := len(r.spans.Ended()); n != 4*goroutines*each {
		t.Fatalf("%d spans, want %d", n, 4*goroutines*each)
	}
}
