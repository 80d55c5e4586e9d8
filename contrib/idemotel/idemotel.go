package idemotel

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/shared/hooklabel"
)

// ScopeName is the instrumentation scope of the meter and the tracer.
const ScopeName = "github.com/idem-go/idem/contrib/idemotel"

// DefaultMaxLabelValues bounds the distinct values of each free-form metric
// attribute (consumer, inbox type, HTTP route, Guard name) unless
// [Options.MaxLabelValues] says otherwise.
const DefaultMaxLabelValues = 100

// Other ("other") replaces a metric attribute value outside its fixed set,
// or beyond the [Options.MaxLabelValues] bound.
const Other = hooklabel.Other

// defaultBuckets are the boundaries, in seconds, that the OpenTelemetry
// semantic conventions recommend for request durations. The SDK's own
// default (0 to 10000) is meant for milliseconds and would put every
// delivery in its first buckets.
var defaultBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}

// DefaultLagBuckets are the boundaries, in seconds, of the outbox lag
// histogram unless [Options.LagBuckets] says otherwise: 10ms to an hour,
// since an event that waits for a retry or for a relay that is down is
// late by minutes.
var DefaultLagBuckets = []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}

// outboxOutcomes are the outcomes an outbox.Relay reports (see
// outbox.Result), whose counters are recorded at zero for each relay.
var outboxOutcomes = [...]idem.Outcome{
	idem.Processed, idem.Retried, idem.DeadLettered, idem.LeaseLost, idem.NotRecorded, idem.Released, idem.Panicked,
}

// outboxDeadReasons are the reasons an outbox event goes to the dead state.
var outboxDeadReasons = [...]idem.DeadReason{idem.DeadMaxAttempts, idem.DeadPermanent}

// Attributes that the semantic conventions do not define.
const (
	attrOutcome        = attribute.Key("idem.outcome")
	attrConsumer       = attribute.Key("idem.consumer")
	attrAttempt        = attribute.Key("idem.attempt")
	attrReason         = attribute.Key("idem.dead_letter.reason")
	attrRetryDelay     = attribute.Key("idem.retry.delay")
	attrInfrastructure = attribute.Key("idem.retry.infrastructure")
	attrKey            = attribute.Key("idem.key")
	attrInboxType      = attribute.Key("idem.inbox.type")
	attrInboxSource    = attribute.Key("idem.inbox.source")
	attrOrderingKey    = attribute.Key("idem.inbox.ordering_key")
	attrScopeHash      = attribute.Key("idem.scope_hash")
	attrStatusClass    = attribute.Key("idem.http.status_class")
	attrGuard          = attribute.Key("idem.guard")
	attrScope          = attribute.Key("idem.scope")
	attrToken          = attribute.Key("idem.token")
	attrTakeover       = attribute.Key("idem.takeover")
	attrRelay          = attribute.Key("idem.relay")
	attrOutboxKey      = attribute.Key("idem.outbox.key")
	// attrOutboxCount prefixes the per-outcome event counts of a batch
	// span: idem.outbox.processed, idem.outbox.retried, ….
	attrOutboxCount = "idem.outbox."
)

// defaultGuard names the Guard calls and the relay of a Telemetry not made
// by For.
const defaultGuard = "default"

// Span names.
const (
	spanConsume = "idem.consume"
	spanInbox   = "idem.inbox"
	spanHTTP    = "idem.http"
	spanGuard   = "idem.guard"
	spanOutbox  = "idem.outbox"
	// eventOutbox is the span event of one event of a published batch.
	eventOutbox = "idem.outbox.message"
)

// Options configures [New]. A nil *Options means the defaults.
type Options struct {
	// MeterProvider creates the instruments. Nil means the global one
	// (otel.GetMeterProvider), which forwards to a provider set later with
	// otel.SetMeterProvider.
	MeterProvider metric.MeterProvider
	// TracerProvider creates the spans. Nil means the global one
	// (otel.GetTracerProvider), which forwards likewise.
	TracerProvider trace.TracerProvider
	// Buckets are the duration histograms' boundaries, in seconds, strictly
	// increasing. Default 5ms to 10s, as the semantic conventions recommend
	// for request durations. A view registered with the SDK overrides them.
	Buckets []float64
	// MaxLabelValues bounds the distinct values each free-form metric
	// attribute may take (consumer, inbox type, HTTP route, Guard name);
	// later values
	// are reported as [Other]. Default [DefaultMaxLabelValues]. Spans are
	// not bounded: they carry the values as they are.
	MaxLabelValues int
	// HTTPRoute adds http.route and http.request.method to the HTTP
	// metrics. The route is the path of the http.ServeMux pattern that
	// matched (r.Pattern), never the request path. It is opt-in because it
	// multiplies the series; spans always carry the route when there is one.
	HTTPRoute bool
	// Consumers are consumer names whose delivery counters are created at
	// zero by New, so that a rate or increase() sees the first dead letter
	// even when it is the consumer's first delivery since start. Consumers
	// not listed get their zero points on their first delivery.
	Consumers []string
	// RecordKeys adds the idempotency key (idem.key) to the spans, the
	// inbox ordering key (idem.inbox.ordering_key) and a Guard call's scope
	// (idem.scope). Off by default: keys often carry customer data (an
	// order number, an account), and scopes may hold a principal. Metrics
	// never carry them.
	RecordKeys bool
	// RecordErrorMessages puts err.Error() in the span status and in the
	// exception event. Off by default, when only the error's type is
	// recorded: idem's own errors quote the scope and key (and an HTTP
	// scope holds the principal), and handler errors often quote data.
	RecordErrorMessages bool
	// Relays are relay names (as given to [Telemetry.For]; "default" for a
	// Telemetry not made by For) whose outbox counters are recorded at
	// zero by New, so that a rate sees a relay's first dead event after a
	// restart. Relays not listed get their zero points on their first
	// published batch.
	Relays []string
	// OutboxTopics adds messaging.destination.name to the outbox event,
	// dead-letter and lag metrics: the topics listed here as themselves,
	// any other as [Other]. Without it (the default) the metrics have no
	// topic. Spans always carry the topic.
	OutboxTopics []string
	// LagBuckets are the outbox lag histogram's boundaries, in seconds,
	// strictly increasing. Default [DefaultLagBuckets].
	LagBuckets []float64
}

// Telemetry holds the instruments and the tracer for idem's hooks, and is
// a hook itself: pass it (or [Telemetry.For]) in the Hooks of every
// component's Config. Create it with [New]; it is safe for concurrent use.
type Telemetry struct {
	tracer   trace.Tracer
	route    bool
	keys     bool
	messages bool
	// guard is the name of the Guard whose calls this Telemetry reports
	// (For), and guardLabel its bounded metric attribute value.
	guard, guardLabel string
	// relay is the name of the relay whose batches this Telemetry reports
	// (For), not yet bounded.
	relay string
	// topics are the topics of Options.OutboxTopics; nil: no topic
	// attribute on the outbox metrics.
	topics map[string]bool
	// outboxSets caches the attribute sets of the outbox measurements by
	// outboxSetKey (bounded: relay labels × outcome labels × topic
	// labels), since an attribute set costs allocations and a sort, and
	// the relay reports every event.
	outboxSets *sync.Map

	deliveries    metric.Int64Counter
	handle        metric.Float64Histogram
	deadLetters   metric.Int64Counter
	infraRetries  metric.Int64Counter
	inboxRuns     metric.Int64Counter
	inboxDuration metric.Float64Histogram
	inboxDead     metric.Int64Counter
	httpRequests  metric.Int64Counter
	httpDuration  metric.Float64Histogram
	guardCalls    metric.Int64Counter
	guardDuration metric.Float64Histogram
	outboxEvents  metric.Int64Counter
	outboxTime    metric.Float64Histogram
	outboxLag     metric.Float64Histogram
	outboxDead    metric.Int64Counter

	consumers, types, routes, guards, relays *hooklabel.Set
}

// New creates the instruments from the meter provider and the tracer from
// the tracer provider. It fails on invalid options, or when the provider
// refuses an instrument. Unlike Prometheus registries, meter providers
// accept the same instruments twice, so several Telemetry values may share
// one provider (their measurements add up).
func New(opts *Options) (*Telemetry, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.MaxLabelValues < 0 {
		return nil, fmt.Errorf("idemotel: %w: MaxLabelValues must not be negative, got %d", idem.ErrInvalidConfig, o.MaxLabelValues)
	}
	if o.MaxLabelValues == 0 {
		o.MaxLabelValues = DefaultMaxLabelValues
	}
	for _, bs := range []struct {
		name    string
		buckets []float64
	}{{"Buckets", o.Buckets}, {"LagBuckets", o.LagBuckets}} {
		for i, b := range bs.buckets {
			if math.IsNaN(b) || math.IsInf(b, 0) || (i > 0 && b <= bs.buckets[i-1]) {
				return nil, fmt.Errorf("idemotel: %w: %s must be finite and strictly increasing, got %v", idem.ErrInvalidConfig, bs.name, bs.buckets)
			}
		}
	}
	if len(o.Buckets) == 0 {
		o.Buckets = defaultBuckets
	}
	if len(o.LagBuckets) == 0 {
		o.LagBuckets = DefaultLagBuckets
	}
	// WithExplicitBucketBoundaries keeps the slice it is given.
	o.Buckets, o.LagBuckets = slices.Clone(o.Buckets), slices.Clone(o.LagBuckets)
	mp, tp := o.MeterProvider, o.TracerProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	meter := mp.Meter(ScopeName, metric.WithSchemaURL(semconv.SchemaURL))

	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := meter.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	histogramIn := func(buckets []float64, name, desc string) metric.Float64Histogram {
		h, err := meter.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(buckets...))
		errs = append(errs, err)
		return h
	}
	histogram := func(name, desc string) metric.Float64Histogram { return histogramIn(o.Buckets, name, desc) }
	var topics map[string]bool
	if len(o.OutboxTopics) > 0 {
		topics = make(map[string]bool, len(o.OutboxTopics))
		for _, tp := range o.OutboxTopics {
			topics[tp] = true
		}
	}
	t := &Telemetry{
		tracer:     tp.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL)),
		route:      o.HTTPRoute,
		keys:       o.RecordKeys,
		messages:   o.RecordErrorMessages,
		guard:      defaultGuard,
		guardLabel: defaultGuard,
		relay:      defaultGuard,
		topics:     topics,
		outboxSets: new(sync.Map),
		deliveries: counter("idem.consumer.deliveries", "{delivery}",
			"Deliveries handled by a consume.Engine, by outcome."),
		handle: histogram("idem.consumer.handle.duration",
			"Time a consume.Engine spent on one delivery, by outcome."),
		deadLetters: counter("idem.consumer.dead_letters", "{delivery}",
			"Deliveries moved to the dead letters, by reason. Normally zero."),
		infraRetries: counter("idem.consumer.infrastructure_retries", "{delivery}",
			"Retries caused by infrastructure failures, which do not count toward MaxAttempts."),
		inboxRuns: counter("idem.inbox.runs", "{run}",
			"Inbox rows run by an inbox.Worker, by event type and outcome."),
		inboxDuration: histogram("idem.inbox.run.duration",
			"Time an inbox.Worker spent on one row, by event type and outcome."),
		inboxDead: counter("idem.inbox.dead_letters", "{run}",
			"Inbox rows moved to the dead letters, by event type and reason. Normally zero."),
		httpRequests: counter("idem.http.requests", "{request}",
			"Requests handled by the idemhttp middleware, by outcome and status class."),
		httpDuration: histogram("idem.http.request.duration",
			"Latency of requests handled by the idemhttp middleware, by outcome."),
		guardCalls: counter("idem.guard.calls", "{call}",
			"Calls of idem.Guard.Do, by guard name and outcome."),
		guardDuration: histogram("idem.guard.call.duration",
			"Time an idem.Guard.Do call took, by guard name and outcome."),
		outboxEvents: counter("idem.outbox.events", "{event}",
			"Outbox events an outbox.Relay published or tried to, by relay name and outcome."),
		outboxTime: histogram("idem.outbox.publish.duration",
			"Time an outbox.Relay spent on each event's batch, from the claimed rows to the recorded outcome (publish, then the sent or failed mark), by relay name and outcome. One measurement per event."),
		outboxLag: histogramIn(o.LagBuckets, "idem.outbox.lag",
			"Time from an outbox event's creation (the store's clock) to the relay marking it sent, by relay name. One measurement per event sent."),
		outboxDead: counter("idem.outbox.dead_letters", "{event}",
			"Outbox events moved to the dead state, by relay name and reason. Normally zero."),
		consumers: hooklabel.NewSet(o.MaxLabelValues),
		types:     hooklabel.NewSet(o.MaxLabelValues),
		routes:    hooklabel.NewSet(o.MaxLabelValues),
		guards:    hooklabel.NewSet(o.MaxLabelValues),
		relays:    hooklabel.NewSet(o.MaxLabelValues),
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("idemotel: creating instruments: %w", err)
	}
	for _, name := range o.Consumers {
		t.consumerLabel(name)
	}
	for _, name := range o.Relays {
		t.relayLabel(name)
	}
	return t, nil
}

// consumerLabel returns the bounded attribute value for a consumer name
// and, the first time it is seen, records zero for its delivery counters:
// a rate cannot see a counter's first increment if the series only appears
// with it.
func (t *Telemetry) consumerLabel(name string) string {
	label, first := t.consumers.Label(name)
	if first {
		ctx := context.Background()
		c := attrConsumer.String(label)
		for _, o := range hooklabel.ConsumeOutcomes() {
			t.deliveries.Add(ctx, 0, metric.WithAttributes(c, attrOutcome.String(o.String())))
		}
		t.deadLetters.Add(ctx, 0, metric.WithAttributes(c, attrReason.String(string(idem.DeadMaxAttempts))))
		t.infraRetries.Add(ctx, 0, metric.WithAttributes(c))
	}
	return label
}

// The hooks. Telemetry implements the start and end hooks of every
// component: the start hook starts the span, a child of the span in the
// component's context, and returns a context holding it, so that the
// work's own spans are its children; the end hook ends it and records the
// measurements.
var (
	_ idem.DoStartHook          = (*Telemetry)(nil)
	_ idem.DoEndHook            = (*Telemetry)(nil)
	_ consume.DeliveryStartHook = (*Telemetry)(nil)
	_ consume.DeliveryEndHook   = (*Telemetry)(nil)
	_ inbox.RunStartHook        = (*Telemetry)(nil)
	_ inbox.RunEndHook          = (*Telemetry)(nil)
	_ idemhttp.RequestStartHook = (*Telemetry)(nil)
	_ idemhttp.RequestEndHook   = (*Telemetry)(nil)
	_ outbox.PublishStartHook   = (*Telemetry)(nil)
	_ outbox.PublishEndHook     = (*Telemetry)(nil)
)

// For returns a Telemetry that shares t's instruments and tracer and
// reports Guard calls under idem.guard=name and outbox relay batches under
// idem.relay=name (metric attributes bounded by [Options.MaxLabelValues]).
// Give each Guard (and each idemhttp middleware, whose Guard reports
// through its hooks) and each outbox.Relay a name of its own: Hooks:
// []idem.Hook{tel.For("payments-gateway")}. A Telemetry not made by For
// reports them as idem.guard=default and idem.relay=default. The name
// labels nothing else: consumers carry their own name, and the HTTP and
// inbox instruments have no component attribute.
func (t *Telemetry) For(name string) *Telemetry {
	c := *t
	c.guard = name
	c.guardLabel, _ = t.guards.Label(name)
	c.relay = name
	return &c
}

// spanKey finds, in the context a start hook returned, the span it
// started. The Telemetry is part of the key, so that two of them in one
// component's hooks (For values) each end their own span, and a span
// another hook put in the context after this one's is never taken for it.
type spanKey struct {
	t    *Telemetry
	name string
}

// start starts the span name as a child of the span in ctx, and returns a
// context holding it, for the work and for [Telemetry.end].
func (t *Telemetry) start(ctx context.Context, name string, kind trace.SpanKind, attrs []attribute.KeyValue) context.Context {
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, span := t.tracer.Start(ctx, name, trace.WithSpanKind(kind), trace.WithAttributes(attrs...))
	return context.WithValue(ctx, spanKey{t, name}, span)
}

// end ends the span that start put in ctx (or, when the component called
// no start hook, a span of no length made now), after setting attrs, and
// returns a context holding it, so that the measurements that follow
// carry it as an exemplar.
//
// When failed, the status is Error; error.type is err's type
// (semconv.ErrorType: an ErrorType() string method in the chain, or the Go
// type), else the HTTP status code of a 5xx, else "_OTHER". Any err adds
// an exception event. The error message, which may quote keys and scopes,
// is recorded only with RecordErrorMessages; otherwise the status
// description is desc (the outcome).
func (t *Telemetry) end(ctx context.Context, name string, kind trace.SpanKind, attrs []attribute.KeyValue,
	failed bool, err error, desc string, status int) context.Context {
	if ctx == nil {
		ctx = context.Background()
	}
	span, ok := ctx.Value(spanKey{t, name}).(trace.Span)
	if !ok {
		ctx = t.start(ctx, name, kind, nil)
		span = ctx.Value(spanKey{t, name}).(trace.Span)
	}
	if failed {
		switch {
		case err != nil:
			attrs = append(attrs, semconv.ErrorType(err))
		case status >= 500 && status <= 599:
			attrs = append(attrs, semconv.ErrorTypeKey.String(strconv.Itoa(status)))
		default:
			attrs = append(attrs, semconv.ErrorTypeOther)
		}
	}
	span.SetAttributes(attrs...)
	if err != nil {
		ev := []attribute.KeyValue{semconv.ExceptionTypeKey.String(semconv.ErrorType(err).Value.AsString())}
		if t.messages {
			ev = append(ev, semconv.ExceptionMessageKey.String(traceString(err.Error())))
		}
		span.AddEvent(semconv.ExceptionEventName, trace.WithAttributes(ev...))
	}
	if failed {
		if t.messages && err != nil {
			desc = traceString(err.Error())
		}
		span.SetStatus(codes.Error, desc)
	}
	span.End()
	return trace.ContextWithSpan(ctx, span)
}

// consumeFailed reports whether a delivery's span is an error: the message
// is not done (retried, dead-lettered, or requeued because the commit
// outcome is unknown), something panicked, or settling it failed. A
// duplicate is not an error, and neither is a delivery abandoned because
// the consumer shut down.
func consumeFailed(ev consume.Event) bool {
	switch ev.Outcome {
	case idem.Retried, idem.DeadLettered, idem.Requeued, idem.Panicked:
		return true
	case idem.Abandoned:
		return false
	}
	return ev.Err != nil
}

// consumeAttrs are a delivery span's attributes that the start event
// already carries.
func (t *Telemetry) consumeAttrs(ev consume.Event) []attribute.KeyValue {
	attrs := []attribute.KeyValue{
		semconv.MessagingOperationTypeProcess,
		attrConsumer.String(traceString(ev.Consumer)),
	}
	if ev.Attempt > 0 {
		attrs = append(attrs, attrAttempt.Int(ev.Attempt))
	}
	if ev.ID != "" {
		attrs = append(attrs, semconv.MessagingMessageID(traceString(ev.ID)))
	}
	if t.keys && ev.Key != "" {
		attrs = append(attrs, attrKey.String(traceString(ev.Key)))
	}
	return attrs
}

// OnDeliveryStart implements consume.DeliveryStartHook: it starts the
// delivery's span (idem.consume, kind consumer), a child of the span in
// ctx (the broker adapter's), and the parent of the handler's spans. The
// message id is a span attribute, never a metric attribute; the dedupe key
// is neither unless [Options.RecordKeys].
func (t *Telemetry) OnDeliveryStart(ctx context.Context, ev consume.Event) context.Context {
	return t.start(ctx, spanConsume, trace.SpanKindConsumer, t.consumeAttrs(ev))
}

// OnDeliveryEnd implements consume.DeliveryEndHook: it ends the delivery's
// span with its outcome and records the delivery by consumer and outcome,
// with its dead-letter reason or infrastructure retry.
func (t *Telemetry) OnDeliveryEnd(ctx context.Context, ev consume.Event) {
	outcome := hooklabel.Outcome(ev.Outcome)
	attrs := append(t.consumeAttrs(ev), attrOutcome.String(outcome))
	desc := outcome
	switch ev.Outcome {
	case idem.DeadLettered:
		if ev.Reason != "" {
			attrs = append(attrs, attrReason.String(traceString(string(ev.Reason))))
			desc += ": " + traceString(string(ev.Reason))
		}
	case idem.Retried:
		attrs = append(attrs, attrRetryDelay.Float64(ev.Delay.Seconds()), attrInfrastructure.Bool(ev.Infrastructure))
	}
	sctx := t.end(ctx, spanConsume, trace.SpanKindConsumer, attrs, consumeFailed(ev), ev.Err, desc, 0)

	consumer := t.consumerLabel(ev.Consumer)
	c := attrConsumer.String(consumer)
	set := metric.WithAttributes(c, attrOutcome.String(outcome))
	t.deliveries.Add(sctx, 1, set)
	t.handle.Record(sctx, ev.Duration.Seconds(), set)
	switch ev.Outcome {
	case idem.DeadLettered:
		t.deadLetters.Add(sctx, 1, metric.WithAttributes(c, attrReason.String(hooklabel.DeadReason(ev.Reason))))
	case idem.Retried:
		if ev.Infrastructure {
			t.infraRetries.Add(sctx, 1, metric.WithAttributes(c))
		}
	}
}

// inboxFailed reports whether a run's span is an error: the row is not
// processed (retried, dead-lettered), this worker lost it (lease lost,
// nothing committed), or the worker panicked. A row released, or abandoned
// by a hard stop, did not run to its end because the worker is stopping,
// which is not an error.
func inboxFailed(ev inbox.Event) bool {
	switch ev.Outcome {
	case idem.Retried, idem.DeadLettered, idem.LeaseLost, idem.Panicked:
		return true
	case idem.Released, idem.Abandoned:
		return false
	}
	return ev.Err != nil
}

// inboxAttrs are a run span's attributes that the start event already
// carries.
func (t *Telemetry) inboxAttrs(m inbox.Message) []attribute.KeyValue {
	attrs := []attribute.KeyValue{
		semconv.MessagingOperationTypeProcess,
		attrInboxType.String(traceString(m.Type)),
	}
	if m.Source != "" {
		attrs = append(attrs, attrInboxSource.String(traceString(m.Source)))
	}
	if m.ID != "" {
		attrs = append(attrs, semconv.MessagingMessageID(traceString(m.ID)))
	}
	if m.Attempt > 0 {
		attrs = append(attrs, attrAttempt.Int(m.Attempt))
	}
	if t.keys && m.OrderingKey != "" {
		attrs = append(attrs, attrOrderingKey.String(traceString(m.OrderingKey)))
	}
	return attrs
}

// OnRunStart implements inbox.RunStartHook: it starts the run's span
// (idem.inbox, kind consumer), a child of the span in the worker's
// context and the parent of the handler's spans. The event type is a
// metric attribute, bounded by [Options.MaxLabelValues]; the source,
// message id and ordering key never are.
func (t *Telemetry) OnRunStart(ctx context.Context, ev inbox.Event) context.Context {
	return t.start(ctx, spanInbox, trace.SpanKindConsumer, t.inboxAttrs(ev.Message))
}

// OnRunEnd implements inbox.RunEndHook: it ends the run's span with its
// outcome (and dead-letter reason) and records the run by event type and
// outcome, and a dead letter by event type and reason. Runs that did not
// execute a handler (released rows, leases lost before the run) are
// counted but not timed.
func (t *Telemetry) OnRunEnd(ctx context.Context, ev inbox.Event) {
	outcome := hooklabel.Outcome(ev.Outcome)
	attrs := append(t.inboxAttrs(ev.Message), attrOutcome.String(outcome))
	desc := outcome
	if ev.Outcome == idem.DeadLettered && ev.DeadReason != "" {
		attrs = append(attrs, attrReason.String(traceString(string(ev.DeadReason))))
		desc += ": " + traceString(string(ev.DeadReason))
	}
	sctx := t.end(ctx, spanInbox, trace.SpanKindConsumer, attrs, inboxFailed(ev), ev.Err, desc, 0)

	typ, _ := t.types.Label(ev.Message.Type)
	set := metric.WithAttributes(attrInboxType.String(typ), attrOutcome.String(outcome))
	t.inboxRuns.Add(sctx, 1, set)
	if ev.Duration > 0 {
		t.inboxDuration.Record(sctx, ev.Duration.Seconds(), set)
	}
	if ev.Outcome == idem.DeadLettered {
		t.inboxDead.Add(sctx, 1, metric.WithAttributes(attrInboxType.String(typ), attrReason.String(hooklabel.DeadReason(ev.DeadReason))))
	}
}

// httpFailed reports whether a request's span is an error: a store
// failure, a lost lease, a result that could not be recorded, an upstream
// whose outcome is unknown or a panic, or a 5xx response, as for a server
// span. Client errors (a reused key, a request in flight, a missing key)
// and a client that went away are not errors of the service.
func httpFailed(ev idemhttp.Event) bool {
	switch ev.Outcome {
	case idem.Errored, idem.Panicked, idem.NotRecorded, idem.InDoubt:
		return true
	}
	return ev.Status >= 500 && ev.Status <= 599
}

var httpMethods = map[string]attribute.KeyValue{
	http.MethodConnect: semconv.HTTPRequestMethodConnect, http.MethodDelete: semconv.HTTPRequestMethodDelete,
	http.MethodGet: semconv.HTTPRequestMethodGet, http.MethodHead: semconv.HTTPRequestMethodHead,
	http.MethodOptions: semconv.HTTPRequestMethodOptions, http.MethodPatch: semconv.HTTPRequestMethodPatch,
	http.MethodPost: semconv.HTTPRequestMethodPost, http.MethodPut: semconv.HTTPRequestMethodPut,
	http.MethodTrace: semconv.HTTPRequestMethodTrace,
}

func httpMethod(r *http.Request) attribute.KeyValue {
	if r != nil {
		if kv, ok := httpMethods[r.Method]; ok {
			return kv
		}
	}
	return semconv.HTTPRequestMethodOther
}

// routeOf returns the path of the ServeMux pattern ("[METHOD
// ][HOST]/PATH") that matched r, which is what http.route means: the
// method has its own attribute, and the host is not part of a route. It
// is "" when r matched no pattern.
func routeOf(r *http.Request) string {
	if r == nil {
		return ""
	}
	pattern := r.Pattern
	if i := strings.IndexAny(pattern, " \t"); i >= 0 {
		pattern = strings.TrimLeft(pattern[i:], " \t")
	}
	if i := strings.IndexByte(pattern, '/'); i > 0 {
		pattern = pattern[i:]
	}
	return pattern
}

// httpAttrs are a request span's attributes that the start event already
// carries.
func (t *Telemetry) httpAttrs(ev idemhttp.Event) []attribute.KeyValue {
	var attrs []attribute.KeyValue
	if route := routeOf(ev.Request); route != "" {
		attrs = append(attrs, semconv.HTTPRoute(traceString(route)))
	}
	if ev.ScopeHash != "" {
		attrs = append(attrs, attrScopeHash.String(traceString(ev.ScopeHash)))
	}
	if t.keys && ev.Key != "" {
		attrs = append(attrs, attrKey.String(traceString(ev.Key)))
	}
	return attrs
}

// OnRequestStart implements idemhttp.RequestStartHook: it starts the
// request's span (idem.http, kind internal), a child of the span in the
// request's context (otelhttp's server span) and the parent of the
// handler's spans, or of the proxy's upstream call. The idempotency key is
// a span attribute only with [Options.RecordKeys]; the scope hash is a
// span attribute; neither, nor the principal or the URL path, is ever a
// metric attribute.
func (t *Telemetry) OnRequestStart(ctx context.Context, ev idemhttp.Event) context.Context {
	return t.start(ctx, spanHTTP, trace.SpanKindInternal, t.httpAttrs(ev))
}

// OnRequestEnd implements idemhttp.RequestEndHook: it ends the request's
// span with its outcome and status, and records the request by outcome and
// status class. The route is a metric attribute only with
// [Options.HTTPRoute].
func (t *Telemetry) OnRequestEnd(ctx context.Context, ev idemhttp.Event) {
	outcome := hooklabel.Outcome(ev.Outcome)
	attrs := append(t.httpAttrs(ev), attrOutcome.String(outcome))
	desc := outcome
	if ev.Status != 0 {
		attrs = append(attrs, semconv.HTTPResponseStatusCode(ev.Status))
		desc += ": " + strconv.Itoa(ev.Status)
	}
	sctx := t.end(ctx, spanHTTP, trace.SpanKindInternal, attrs, httpFailed(ev), ev.Err, desc, ev.Status)

	requests := []attribute.KeyValue{attrOutcome.String(outcome), attrStatusClass.String(hooklabel.StatusClass(ev.Status))}
	duration := []attribute.KeyValue{attrOutcome.String(outcome)}
	if t.route {
		// No route: the middleware is not inside a ServeMux, and the
		// attribute is left out as the semantic conventions ask.
		if route := routeOf(ev.Request); route != "" {
			label, _ := t.routes.Label(route)
			requests = append(requests, semconv.HTTPRoute(label))
			duration = append(duration, semconv.HTTPRoute(label))
		}
		m := httpMethod(ev.Request)
		requests = append(requests, m)
		duration = append(duration, m)
	}
	t.httpRequests.Add(sctx, 1, metric.WithAttributes(requests...))
	t.httpDuration.Record(sctx, ev.Duration.Seconds(), metric.WithAttributes(duration...))
}

// guardFailed reports whether a Do call's span is an error: fn failed or
// panicked, the lease was lost, the result could not be recorded, or the
// store failed. A replay is not an error, even of a stored Final error,
// and neither is an execution whose Final error was stored: the error is
// the call's result. A key in progress, reused with another fingerprint
// or invalid is the caller's business, as a 4xx is for HTTP; Do's error
// says so to the caller.
func guardFailed(ev idem.DoEvent) bool {
	switch ev.Outcome {
	case idem.Released, idem.LeaseLost, idem.Panicked, idem.Errored, idem.NotRecorded:
		return true
	case idem.Processed, idem.Duplicate, idem.InProgress, idem.Mismatch, idem.Rejected:
		return false
	}
	return ev.Err != nil
}

// guardAttrs are a Do span's attributes that the start event already
// carries.
func (t *Telemetry) guardAttrs(ev idem.DoEvent) []attribute.KeyValue {
	attrs := []attribute.KeyValue{attrGuard.String(traceString(t.guard))}
	if ev.Scope != "" {
		attrs = append(attrs, attrScopeHash.String(idem.ScopeHash(ev.Scope)))
	}
	if t.keys {
		attrs = append(attrs, attrScope.String(traceString(ev.Scope)))
		if ev.Key != "" {
			attrs = append(attrs, attrKey.String(traceString(ev.Key)))
		}
	}
	return attrs
}

// OnDoStart implements idem.DoStartHook: it starts the call's span
// (idem.guard, kind internal), a child of the span in Do's context and the
// parent of the guarded function's spans. The span carries the scope's
// hash (idem.scope_hash, as idemhttp computes it, so that the two match);
// the scope and key only with [Options.RecordKeys]. Neither is ever a
// metric attribute.
func (t *Telemetry) OnDoStart(ctx context.Context, ev idem.DoEvent) context.Context {
	return t.start(ctx, spanGuard, trace.SpanKindInternal, t.guardAttrs(ev))
}

// OnDoEnd implements idem.DoEndHook: it ends the call's span with its
// outcome, fencing token and takeover, and records the call by guard name
// (see [Telemetry.For]) and outcome.
func (t *Telemetry) OnDoEnd(ctx context.Context, ev idem.DoEvent) {
	outcome := hooklabel.Outcome(ev.Outcome)
	attrs := append(t.guardAttrs(ev), attrOutcome.String(outcome))
	if ev.Token != 0 {
		attrs = append(attrs, attrToken.Int64(ev.Token))
	}
	if ev.Takeover {
		attrs = append(attrs, attrTakeover.Bool(true))
	}
	sctx := t.end(ctx, spanGuard, trace.SpanKindInternal, attrs, guardFailed(ev), ev.Err, outcome, 0)

	set := metric.WithAttributes(attrGuard.String(t.guardLabel), attrOutcome.String(outcome))
	t.guardCalls.Add(sctx, 1, set)
	t.guardDuration.Record(sctx, ev.Duration.Seconds(), set)
}

// maxTraceString bounds free-form span attribute values: idem's keys and
// ids are at most 255 bytes, but a delivery dead-lettered for an invalid
// id reports the id as it came.
const maxTraceString = 1024

// traceString makes s safe for an exporter: valid UTF-8 (protobuf refuses
// anything else, failing the whole batch) and bounded.
func traceString(s string) string {
	if len(s) > maxTraceString {
		cut := maxTraceString
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut]
	}
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	return s
}

// relayLabel returns the bounded attribute value for a relay name and, the
// first time it is seen, records zero for its event and dead-letter
// counters (for each listed topic when the metrics have a topic).
func (t *Telemetry) relayLabel(name string) string {
	label, first := t.relays.Label(name)
	if first {
		ctx := context.Background()
		topics := []string{""}
		if t.topics != nil {
			topics = topics[:0]
			for tp := range t.topics {
				topics = append(topics, tp)
			}
		}
		for _, tp := range topics {
			for _, o := range outboxOutcomes {
				t.outboxEvents.Add(ctx, 0, metric.WithAttributes(t.withTopic(tp, attrRelay.String(label), attrOutcome.String(o.String()))...))
			}
			for _, r := range outboxDeadReasons {
				t.outboxDead.Add(ctx, 0, metric.WithAttributes(t.withTopic(tp, attrRelay.String(label), attrReason.String(string(r)))...))
			}
		}
	}
	return label
}

// withTopic appends the topic attribute to attrs when the outbox metrics
// have one: topic itself if listed in Options.OutboxTopics, else [Other].
func (t *Telemetry) withTopic(topic string, attrs ...attribute.KeyValue) []attribute.KeyValue {
	if t.topics == nil {
		return attrs
	}
	if !t.topics[topic] {
		topic = Other
	}
	return append(attrs, semconv.MessagingDestinationName(topic))
}

// outboxSetKey names the attribute sets of one outbox measurement.
type outboxSetKey struct{ relay, outcome, topic string }

// outboxMeasurement are the attribute sets of an event's measurements.
type outboxMeasurement struct {
	event, time, lag metric.MeasurementOption
}

// outboxSet returns the attribute sets of an event's measurements, made
// once per relay, outcome and topic label.
func (t *Telemetry) outboxSet(relay, outcome, topic string) outboxMeasurement {
	if t.topics != nil && !t.topics[topic] {
		topic = Other
	}
	k := outboxSetKey{relay, outcome, topic}
	if m, ok := t.outboxSets.Load(k); ok {
		return m.(outboxMeasurement)
	}
	r, o := attrRelay.String(relay), attrOutcome.String(outcome)
	m := outboxMeasurement{
		event: metric.WithAttributes(t.withTopic(topic, r, o)...),
		time:  metric.WithAttributes(r, o),
		lag:   metric.WithAttributes(t.withTopic(topic, r)...),
	}
	t.outboxSets.Store(k, m)
	return m
}

// outboxBatch is the span of one published batch, in the context its start
// hook returned, and what the end hooks have reported of it so far: the
// relay calls the end hook once per event, and the last one ends the span.
type outboxBatch struct {
	span trace.Span
	size int // events in the batch
	mu   sync.Mutex
	left int // events not reported yet; the span ends at zero
	// counts are the events per outcome label, in the order first seen.
	counts   []outcomeCount
	failures []string // failed outcomes, for the status description
	firstErr error    // the first failed event's error
}

type outcomeCount struct {
	outcome string
	n       int
}

// outboxFailed reports whether an event's outcome makes its batch's span
// an error: it is not sent (retried, dead, another relay took it over,
// its sent mark failed) or something panicked. An event released by a
// hard stop is not: the relay is stopping and the event goes out later.
func outboxFailed(r outbox.Result) bool {
	switch r.Outcome {
	case idem.Retried, idem.DeadLettered, idem.LeaseLost, idem.NotRecorded, idem.Panicked:
		return true
	case idem.Processed, idem.Released:
		return false
	}
	return r.Err != nil
}

// outboxStartAttrs are a batch span's attributes known at its start.
func (t *Telemetry) outboxStartAttrs(msgs []outbox.Message) []attribute.KeyValue {
	attrs := []attribute.KeyValue{
		semconv.MessagingOperationTypeSend,
		semconv.MessagingBatchMessageCount(len(msgs)),
		attrRelay.String(traceString(t.relay)),
	}
	if len(msgs) > 0 {
		topic := msgs[0].Topic
		for _, m := range msgs[1:] {
			if m.Topic != topic {
				topic = ""
				break
			}
		}
		if topic != "" {
			attrs = append(attrs, semconv.MessagingDestinationName(traceString(topic)))
		}
	}
	return attrs
}

// OnPublishStart implements outbox.PublishStartHook: it starts the batch's
// span (idem.outbox, kind client), a child of the span in the relay's
// context and the parent of the publisher's spans. It carries the relay's
// name (idem.relay), the batch size (messaging.batch.message_count) and,
// when every event of the batch has the same topic, the topic
// (messaging.destination.name).
func (t *Telemetry) OnPublishStart(ctx context.Context, msgs []outbox.Message) context.Context {
	ctx = t.start(ctx, spanOutbox, trace.SpanKindClient, t.outboxStartAttrs(msgs))
	span := ctx.Value(spanKey{t, spanOutbox}).(trace.Span)
	if len(msgs) == 0 {
		span.End()
		return ctx
	}
	return context.WithValue(ctx, spanKey{t, spanOutbox}, &outboxBatch{span: span, size: len(msgs), left: len(msgs)})
}

// outboxEventAttrs are the attributes of one event's span event.
func (t *Telemetry) outboxEventAttrs(r outbox.Result, outcome string) []attribute.KeyValue {
	m := r.Message
	attrs := []attribute.KeyValue{
		semconv.MessagingMessageID(traceString(m.ID)),
		semconv.MessagingDestinationName(traceString(m.Topic)),
		attrOutcome.String(outcome),
	}
	if m.Attempt > 0 {
		attrs = append(attrs, attrAttempt.Int(m.Attempt))
	}
	if t.keys && m.Key != "" {
		attrs = append(attrs, attrOutboxKey.String(traceString(m.Key)))
	}
	if r.Outcome == idem.DeadLettered && r.DeadReason != "" {
		attrs = append(attrs, attrReason.String(traceString(string(r.DeadReason))))
	}
	if r.Err != nil {
		attrs = append(attrs, semconv.ErrorType(r.Err))
		if t.messages {
			attrs = append(attrs, semconv.ExceptionMessageKey.String(traceString(r.Err.Error())))
		}
	}
	return attrs
}

// add adds one event to the batch's span, as a span event with attrs,
// and reports whether it was the batch's last, after which the caller
// ends the span. ok is false when the batch had already ended (more end
// hook calls than events).
func (b *outboxBatch) add(r outbox.Result, outcome string, attrs []attribute.KeyValue) (last, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.left <= 0 {
		return false, false
	}
	b.left--
	b.span.AddEvent(eventOutbox, trace.WithAttributes(attrs...))
	i := slices.IndexFunc(b.counts, func(c outcomeCount) bool { return c.outcome == outcome })
	if i < 0 {
		b.counts = append(b.counts, outcomeCount{outcome: outcome})
		i = len(b.counts) - 1
		if outboxFailed(r) {
			b.failures = append(b.failures, outcome)
		}
	}
	b.counts[i].n++
	if outboxFailed(r) && b.firstErr == nil {
		b.firstErr = r.Err
		if b.firstErr == nil {
			b.firstErr = errors.New(outcome)
		}
	}
	return b.left == 0, true
}

// endOutbox sets the batch span's outcome counts (and idem.outcome when
// every event had the same outcome) and status, and ends it. The
// status is Error when an event failed (see outboxFailed), with the
// failed outcomes and their counts as description ("retried 2,
// dead_lettered 1 of 100") and error.type of the first failure's error.
func (t *Telemetry) endOutbox(b *outboxBatch) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.counts) == 1 {
		b.span.SetAttributes(attrOutcome.String(b.counts[0].outcome))
	}
	var desc []string
	for _, c := range b.counts {
		b.span.SetAttributes(attribute.Int(attrOutboxCount+c.outcome, c.n))
		if slices.Contains(b.failures, c.outcome) {
			desc = append(desc, c.outcome+" "+strconv.Itoa(c.n))
		}
	}
	if b.firstErr != nil {
		b.span.SetAttributes(semconv.ErrorType(b.firstErr))
		d := strings.Join(desc, ", ") + " of " + strconv.Itoa(b.size)
		if t.messages {
			d = traceString(b.firstErr.Error())
		}
		b.span.SetStatus(codes.Error, d)
	}
	b.span.End()
}

// OnPublishEnd implements outbox.PublishEndHook. It adds the event to its
// batch's span as a span event (idem.outbox.message: messaging.message.id,
// messaging.destination.name, idem.outcome, idem.attempt,
// idem.dead_letter.reason when dead, error.type when failed) and, for the
// batch's last event, ends the span with the number of events per outcome
// (idem.outbox.processed, idem.outbox.retried, …) and, when they all had
// the same one, idem.outcome. It records the event by
// relay name (see [Telemetry.For]) and outcome, the time its batch took,
// its dead-letter reason and, when it was sent, its lag: the time from its
// creation (the store's clock) to now, a negative one (clock skew) as
// zero; an event without a creation time, or not sent, has none. The
// measurements are made in the batch span's context.
func (t *Telemetry) OnPublishEnd(ctx context.Context, r outbox.Result) {
	if ctx == nil {
		ctx = context.Background()
	}
	outcome := hooklabel.Outcome(r.Outcome)
	attrs := t.outboxEventAttrs(r, outcome)
	b, _ := ctx.Value(spanKey{t, spanOutbox}).(*outboxBatch)
	last, ok := false, false
	if b != nil {
		last, ok = b.add(r, outcome, attrs)
	}
	if !ok {
		// No start hook (a hand-written caller), or more events than the
		// batch had: a batch of this one event, of no length.
		ctx = t.start(ctx, spanOutbox, trace.SpanKindClient, t.outboxStartAttrs([]outbox.Message{r.Message}))
		b = &outboxBatch{span: ctx.Value(spanKey{t, spanOutbox}).(trace.Span), size: 1, left: 1}
		last, _ = b.add(r, outcome, attrs)
	}
	if last {
		t.endOutbox(b)
	}
	sctx := trace.ContextWithSpan(ctx, b.span)

	relay := t.relayLabel(t.relay)
	set := t.outboxSet(relay, outcome, r.Message.Topic)
	t.outboxEvents.Add(sctx, 1, set.event)
	if r.Duration > 0 {
		t.outboxTime.Record(sctx, r.Duration.Seconds(), set.time)
	}
	switch r.Outcome {
	case idem.Processed:
		if !r.Message.CreatedAt.IsZero() {
			lag := max(time.Since(r.Message.CreatedAt), 0)
			t.outboxLag.Record(sctx, lag.Seconds(), set.lag)
		}
	case idem.DeadLettered:
		t.outboxDead.Add(sctx, 1, metric.WithAttributes(t.withTopic(r.Message.Topic, attrRelay.String(relay), attrReason.String(hooklabel.DeadReason(r.DeadReason)))...))
	}
}
