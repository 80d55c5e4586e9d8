package idemotel

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/outbox/outboxtest"
	"github.com/idem-go/idem/shared/hooktest"
)

// outboxEvents returns the idem.outbox.message span events of s, by
// message id, as attribute maps.
func outboxEvents(s sdktrace.ReadOnlySpan) map[string]map[attribute.Key]attribute.Value {
	out := map[string]map[attribute.Key]attribute.Value{}
	for _, e := range s.Events() {
		if e.Name != eventOutbox {
			continue
		}
		m := map[attribute.Key]attribute.Value{}
		for _, a := range e.Attributes {
			m[a.Key] = a.Value
		}
		out[m["messaging.message.id"].AsString()] = m
	}
	return out
}

func TestOutboxHooksWithRealRelay(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	ctx, caller := r.tp.Tracer("app").Start(t.Context(), "relay loop")
	hooktest.DriveOutbox(t, ctx, []idem.Hook{r.tel})
	caller.End()

	spans := r.ended(spanOutbox)
	if len(spans) != 4 {
		t.Fatalf("%d batch spans, want 4", len(spans))
	}
	for _, s := range spans {
		childOf(t, "batch", s, caller.SpanContext())
		if s.SpanKind() != trace.SpanKindClient || str(s, "messaging.operation.type") != "send" || str(s, attrRelay) != "default" {
			t.Errorf("batch span %v %v", s.SpanKind(), attrsOf(s))
		}
	}

	first := spans[0]
	a := attrsOf(first)
	if a["messaging.batch.message_count"].AsInt64() != 4 || a["idem.outbox.processed"].AsInt64() != 2 ||
		a["idem.outbox.retried"].AsInt64() != 1 || a["idem.outbox.dead_lettered"].AsInt64() != 1 {
		t.Errorf("first batch: %v", a)
	}
	if _, ok := a["messaging.destination.name"]; ok {
		t.Error("a batch of two topics has one destination")
	}
	if _, ok := a[attrOutcome]; ok {
		t.Error("a batch of several outcomes has one")
	}
	if st := first.Status(); st.Code != codes.Error || st.Description != "retried 1, dead_lettered 1 of 4" {
		t.Errorf("first batch status %v", st)
	}
	if a["error.type"].AsString() != "*errors.errorString" {
		t.Errorf("error.type %q", a["error.type"].AsString())
	}
	evs := outboxEvents(first)
	if len(evs) != 4 {
		t.Fatalf("%d span events, want one per event", len(evs))
	}
	if e := evs["ok-secret-1"]; e[attrOutcome].AsString() != "processed" || e["messaging.destination.name"].AsString() != "orders" ||
		e[attrAttempt].AsInt64() != 1 {
		t.Errorf("processed event %v", e)
	}
	if e := evs["perm-secret-1"]; e[attrOutcome].AsString() != "dead_lettered" || e[attrReason].AsString() != "permanent" ||
		e["error.type"].AsString() == "" {
		t.Errorf("dead event %v", e)
	}
	if e := evs["retry-secret-1"]; e[attrOutcome].AsString() != "retried" {
		t.Errorf("retried event %v", e)
	}

	for i, want := range []struct {
		outcome string
		code    codes.Code
	}{{"lease_lost", codes.Error}, {"not_recorded", codes.Error}, {"released", codes.Unset}} {
		s := spans[i+1]
		if str(s, attrOutcome) != want.outcome || s.Status().Code != want.code || str(s, "messaging.destination.name") != "secret-topic" {
			t.Errorf("%s batch: %v %v", want.outcome, attrsOf(s), s.Status())
		}
	}

	hooktest.WantCounts(t, r.points(t), map[string]float64{
		"idem.outbox.events{idem.outcome=processed,idem.relay=default}":                     2,
		"idem.outbox.events{idem.outcome=retried,idem.relay=default}":                       1,
		"idem.outbox.events{idem.outcome=dead_lettered,idem.relay=default}":                 1,
		"idem.outbox.events{idem.outcome=lease_lost,idem.relay=default}":                    1,
		"idem.outbox.events{idem.outcome=not_recorded,idem.relay=default}":                  1,
		"idem.outbox.events{idem.outcome=released,idem.relay=default}":                      1,
		"idem.outbox.events{idem.outcome=panicked,idem.relay=default}":                      0,
		"idem.outbox.publish.duration{idem.outcome=processed,idem.relay=default}":           2,
		"idem.outbox.publish.duration{idem.outcome=released,idem.relay=default}":            1,
		"idem.outbox.lag{idem.relay=default}":                                               2,
		"idem.outbox.dead_letters{idem.dead_letter.reason=permanent,idem.relay=default}":    1,
		"idem.outbox.dead_letters{idem.dead_letter.reason=max_attempts,idem.relay=default}": 0,
	})
	r.noLeaks(t, "secret")
	// Keys and payloads are never on spans without RecordKeys, nor error
	// messages without RecordErrorMessages.
	spanLeaks(t, spans, "secret-key", "secret-payload", "too large", "connection reset")
}

// The publisher's spans are children of the batch span, and a
// measurement carries it as exemplar context.
func TestOutboxSpanIsTheParentOfThePublishers(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	tracer := r.tp.Tracer("app")
	ob := outboxtest.NewMemory()
	var sent []trace.SpanContext
	pub := outbox.PublisherFunc(func(ctx context.Context, msgs []outbox.Message) []error {
		for _, m := range msgs {
			_, span := tracer.Start(ctx, "broker send "+m.ID)
			sent = append(sent, span.SpanContext())
			span.End()
		}
		return nil
	})
	relay, err := outbox.NewRelay(ob, pub, &outbox.Config{Hooks: []idem.Hook{r.tel}, Logger: hooktest.Quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.InTx(t.Context(), func(ctx context.Context, tx *outboxtest.MemoryTx) error {
		return ob.Write(ctx, tx, outbox.Event{ID: "a", Topic: "orders"}, outbox.Event{ID: "b", Topic: "orders"})
	}); err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	if _, err := relay.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	spans := r.ended(spanOutbox)
	if len(spans) != 1 || len(sent) != 2 {
		t.Fatalf("%d batch spans, %d sends", len(spans), len(sent))
	}
	s := spans[0]
	wantWithin(t, s, before, after)
	if str(s, "messaging.destination.name") != "orders" || str(s, attrOutcome) != "processed" || s.Status().Code != codes.Unset {
		t.Errorf("batch span %v %v", attrsOf(s), s.Status())
	}
	for _, id := range []string{"a", "b"} {
		w := r.ended("broker send " + id)
		if len(w) != 1 {
			t.Fatalf("%d send spans for %s", len(w), id)
		}
		childOf(t, "send "+id, w[0], s.SpanContext())
		covers(t, s, w[0])
	}
}

// With OutboxTopics the listed topics are a metric attribute and any other
// is "other"; For names the relay; Options.Relays are recorded at zero;
// the relay names are bounded.
func TestOutboxTopicsRelaysAndBounds(t *testing.T) {
	t.Parallel()
	r := newRig(t, &Options{OutboxTopics: []string{"orders"}, Relays: []string{"idle-relay"}, MaxLabelValues: 2})
	hooktest.DriveOutbox(t, t.Context(), []idem.Hook{r.tel.For("orders-relay")})
	r.tel.For("third").OnPublishEnd(t.Context(), outbox.Result{Message: outbox.Message{ID: "x", Topic: "orders"}, Outcome: idem.Processed})
	got := r.points(t)
	hooktest.WantCounts(t, got, map[string]float64{
		"idem.outbox.events{idem.outcome=processed,idem.relay=orders-relay,messaging.destination.name=orders}":                 2,
		"idem.outbox.events{idem.outcome=processed,idem.relay=other,messaging.destination.name=orders}":                        1,
		"idem.outbox.events{idem.outcome=retried,idem.relay=orders-relay,messaging.destination.name=other}":                    1,
		"idem.outbox.events{idem.outcome=dead_lettered,idem.relay=idle-relay,messaging.destination.name=orders}":               0,
		"idem.outbox.dead_letters{idem.dead_letter.reason=permanent,idem.relay=orders-relay,messaging.destination.name=other}": 1,
		"idem.outbox.lag{idem.relay=orders-relay,messaging.destination.name=orders}":                                           2,
		"idem.outbox.publish.duration{idem.outcome=processed,idem.relay=orders-relay}":                                         2,
	})
	for k := range got {
		if strings.Contains(k, "secret") || strings.Contains(k, "relay=default") {
			t.Errorf("series %s", k)
		}
	}
	for _, s := range r.ended(spanOutbox) {
		if name := str(s, attrRelay); name != "orders-relay" && name != "third" {
			t.Errorf("span of relay %q", name)
		}
	}
}

// The lag is the time from the event's creation to its end hook; a
// creation time in the future (clock skew) counts as zero, and an event
// without one is not measured.
func TestOutboxLag(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	before := time.Now()
	created := []time.Time{before.Add(-90 * time.Second), before.Add(time.Hour), {}}
	msgs := make([]outbox.Message, len(created))
	for i, c := range created {
		msgs[i] = outbox.Message{ID: fmt.Sprint(i), Topic: "t", Attempt: 1, CreatedAt: c}
	}
	ctx := r.tel.OnPublishStart(t.Context(), msgs)
	for _, m := range msgs {
		r.tel.OnPublishEnd(ctx, outbox.Result{Message: m, Outcome: idem.Processed, Duration: 3 * time.Millisecond})
	}
	elapsed := time.Since(before).Seconds()
	lag := r.histogram(t, "idem.outbox.lag{idem.relay=default}")
	if lag.Count != 2 || lag.Sum < 90 || lag.Sum > 90+elapsed {
		t.Errorf("lag count %d sum %v, want 2 and 90s (+ %vs)", lag.Count, lag.Sum, elapsed)
	}
	if d := r.histogram(t, "idem.outbox.publish.duration{idem.outcome=processed,idem.relay=default}"); math.Abs(d.Sum-0.009) > 1e-9 {
		t.Errorf("publish duration sum %v, want the reported durations", d.Sum)
	}
	if b := r.histogram(t, "idem.outbox.lag{idem.relay=default}").Bounds; len(b) != len(DefaultLagBuckets) || b[len(b)-1] != 3600 {
		t.Errorf("lag bounds %v", b)
	}
	if spans := r.ended(spanOutbox); len(spans) != 1 || len(outboxEvents(spans[0])) != 3 {
		t.Errorf("%d batch spans", len(spans))
	}
}

func TestOutboxKeysAndErrorMessagesAreOptIn(t *testing.T) {
	t.Parallel()
	r := newRig(t, &Options{RecordKeys: true, RecordErrorMessages: true})
	hooktest.DriveOutbox(t, t.Context(), []idem.Hook{r.tel})
	spans := r.ended(spanOutbox)
	if len(spans) != 4 {
		t.Fatalf("%d batch spans", len(spans))
	}
	evs := outboxEvents(spans[0])
	if got := evs["ok-secret-1"][attrOutboxKey].AsString(); got != "secret-key-ok-secret-1" {
		t.Errorf("key %q", got)
	}
	if got := evs["perm-secret-1"]["exception.message"].AsString(); !strings.Contains(got, "message too large") {
		t.Errorf("error message %q", got)
	}
	if got := spans[0].Status().Description; got != "broker unavailable" {
		t.Errorf("status %q, want the first failure's message", got)
	}
	spanLeaks(t, spans, "secret-payload")
}

func TestBadLagBuckets(t *testing.T) {
	t.Parallel()
	if _, err := New(&Options{LagBuckets: []float64{1, 1}}); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("got %v", err)
	}
}

// A Relay with several loops and two Telemetry values reports from
// several goroutines: every batch span ends, once.
func TestOutboxConcurrentRelay(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	const events = 300
	hooktest.DriveConcurrentOutbox(t, []idem.Hook{r.tel, r.tel.For("second")}, events)
	hooktest.WantCounts(t, r.points(t), map[string]float64{
		"idem.outbox.events{idem.outcome=processed,idem.relay=default}": events,
		"idem.outbox.events{idem.outcome=processed,idem.relay=second}":  events,
	})
	total := map[string]int64{}
	for _, s := range r.ended(spanOutbox) {
		total[str(s, attrRelay)] += attrsOf(s)["idem.outbox.processed"].AsInt64()
	}
	if total["default"] != events || total["second"] != events {
		t.Errorf("events in ended batch spans: %v", total)
	}
}

// BenchmarkOutboxHooks is the hooks' cost per event, as the relay calls
// them for a batch of 100 sent events, with an SDK tracer that records
// every span (and exports none) and an SDK meter.
func BenchmarkOutboxHooks(b *testing.B) {
	tp := sdktrace.NewTracerProvider() // records every span, exports none
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	tel, err := New(&Options{TracerProvider: tp, MeterProvider: mp})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	created := time.Now()
	msgs := make([]outbox.Message, 100)
	rs := make([]outbox.Result, len(msgs))
	for i := range msgs {
		msgs[i] = outbox.Message{ID: fmt.Sprint(i), Topic: "orders", Attempt: 1, CreatedAt: created}
		rs[i] = outbox.Result{Message: msgs[i], Outcome: idem.Processed, Duration: time.Millisecond}
	}
	b.ReportAllocs()
	for b.Loop() {
		bctx := tel.OnPublishStart(ctx, msgs)
		for _, r := range rs {
			tel.OnPublishEnd(bctx, r)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(rs)), "ns/event")
}
