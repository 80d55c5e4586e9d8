package idemprom

import (
	"context"
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/shared/hooklabel"
)

// DefaultNamespace prefixes every metric name unless [Options.Namespace]
// says otherwise.
const DefaultNamespace = "idem"

// DefaultMaxLabelValues bounds the distinct values of each free-form label
// (consumer, inbox type, HTTP route) unless [Options.MaxLabelValues] says
// otherwise.
const DefaultMaxLabelValues = 100

// Other ("other") replaces a label value outside its fixed set, or beyond
// the [Options.MaxLabelValues] bound.
const Other = hooklabel.Other

// defaultGuard labels the Guard calls of Metrics not made by For.
const defaultGuard = "default"

// Options configures [New]. A nil *Options means the defaults.
type Options struct {
	// Namespace prefixes every metric name. Default [DefaultNamespace].
	Namespace string
	// ConstLabels are added to every series (a service or cluster name).
	// They must not collide with the variable labels.
	ConstLabels prometheus.Labels
	// Buckets are the histogram buckets, in seconds. Default
	// prometheus.DefBuckets.
	Buckets []float64
	// MaxLabelValues bounds the distinct values each free-form label may
	// take (consumer, inbox type, HTTP route); later values are reported as
	// [Other]. Default [DefaultMaxLabelValues]. The bound protects Prometheus
	// when event types come from producers you do not control.
	MaxLabelValues int
	// HTTPRoute adds a route label to the HTTP metrics, from the
	// http.ServeMux pattern that matched (r.Pattern). It is opt-in because
	// it multiplies the series; the pattern is bounded by your routes, never
	// the request path. Requests without a pattern are reported as "none".
	HTTPRoute bool
	// Consumers are consumer names whose delivery counters are created at
	// zero by New, so that an alert on increase() sees the first dead
	// letter even when it is the consumer's first delivery since start.
	// Consumers not listed get their zero series on their first delivery.
	Consumers []string
}

// Metrics holds the Prometheus collectors for idem's hooks, and is a hook
// itself: pass it (or [Metrics.For]) in the Hooks of every component's
// Config. Create it with [New]; it is safe for concurrent use.
type Metrics struct {
	route bool
	guard string // the guard label of Guard calls (For)

	deliveries   *prometheus.CounterVec
	handle       *prometheus.HistogramVec
	deadLetters  *prometheus.CounterVec
	infraRetries *prometheus.CounterVec
	inboxRuns    *prometheus.CounterVec
	inboxSeconds *prometheus.HistogramVec
	inboxDead    *prometheus.CounterVec
	httpRequests *prometheus.CounterVec
	httpSeconds  *prometheus.HistogramVec
	guardCalls   *prometheus.CounterVec
	guardSeconds *prometheus.HistogramVec
	heartbeat    *prometheus.HistogramVec

	consumers, types, routes, guards *hooklabel.Set
}

// New creates the collectors and registers them with reg. It fails, and
// leaves reg as it was, if any collector is already registered (the same
// namespace registered twice) or the options make an invalid metric.
func New(reg prometheus.Registerer, opts *Options) (*Metrics, error) {
	if reg == nil {
		return nil, fmt.Errorf("idemprom: %w: nil prometheus.Registerer", idem.ErrInvalidConfig)
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Namespace == "" {
		o.Namespace = DefaultNamespace
	}
	if !validNamespace(o.Namespace) {
		// Prometheus accepts any UTF-8 name now, but PromQL then needs quoted
		// names; keep to the classic charset that every tool understands.
		return nil, fmt.Errorf("idemprom: %w: namespace %q must match [a-zA-Z_][a-zA-Z0-9_]*", idem.ErrInvalidConfig, o.Namespace)
	}
	if len(o.Buckets) == 0 {
		o.Buckets = prometheus.DefBuckets
	}
	if o.MaxLabelValues < 0 {
		return nil, fmt.Errorf("idemprom: %w: MaxLabelValues must not be negative, got %d", idem.ErrInvalidConfig, o.MaxLabelValues)
	}
	if o.MaxLabelValues == 0 {
		o.MaxLabelValues = DefaultMaxLabelValues
	}
	httpLabels := []string{"outcome", "status_class"}
	httpTimeLabels := []string{"outcome"}
	if o.HTTPRoute {
		httpLabels = append(httpLabels, "route")
		httpTimeLabels = append(httpTimeLabels, "route")
	}
	counter := func(sub, name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: o.Namespace, Subsystem: sub, Name: name, Help: help, ConstLabels: o.ConstLabels,
		}, labels)
	}
	histogram := func(sub, name, help string, labels ...string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: o.Namespace, Subsystem: sub, Name: name, Help: help, ConstLabels: o.ConstLabels,
			Buckets: o.Buckets,
		}, labels)
	}
	m := &Metrics{
		route: o.HTTPRoute,
		guard: defaultGuard,
		deliveries: counter("consumer", "deliveries_total",
			"Deliveries handled by a consume.Engine, by outcome.", "consumer", "outcome"),
		handle: histogram("consumer", "handle_seconds",
			"Time a consume.Engine spent on one delivery, by outcome.", "consumer", "outcome"),
		deadLetters: counter("consumer", "dead_letters_total",
			"Deliveries moved to the dead letters, by reason. Normally zero.", "consumer", "reason"),
		infraRetries: counter("consumer", "infrastructure_retries_total",
			"Retries caused by infrastructure failures, which do not count toward MaxAttempts.", "consumer"),
		inboxRuns: counter("inbox", "runs_total",
			"Inbox rows run by an inbox.Worker, by event type and outcome.", "type", "outcome"),
		inboxSeconds: histogram("inbox", "run_seconds",
			"Time an inbox.Worker spent on one row, by event type and outcome.", "type", "outcome"),
		inboxDead: counter("inbox", "dead_letters_total",
			"Inbox rows moved to the dead letters, by event type and reason. Normally zero.", "type", "reason"),
		httpRequests: counter("http", "requests_total",
			"Requests handled by the idemhttp middleware, by outcome and status class.", httpLabels...),
		httpSeconds: histogram("http", "request_duration_seconds",
			"Latency of requests handled by the idemhttp middleware, by outcome.", httpTimeLabels...),
		guardCalls: counter("guard", "calls_total",
			"Calls of idem.Guard.Do, by guard name and outcome.", "guard", "outcome"),
		guardSeconds: histogram("guard", "call_seconds",
			"Time an idem.Guard.Do call took, by guard name and outcome.", "guard", "outcome"),
		heartbeat: histogram("guard", "heartbeat_max_seconds",
			"The slowest lease heartbeat of each execution that sent one, by guard name. A value near a third of the lease puts the lease at risk.", "guard"),
		consumers: hooklabel.NewSet(o.MaxLabelValues),
		types:     hooklabel.NewSet(o.MaxLabelValues),
		routes:    hooklabel.NewSet(o.MaxLabelValues),
		guards:    hooklabel.NewSet(o.MaxLabelValues),
	}
	collectors := []prometheus.Collector{
		m.deliveries, m.handle, m.deadLetters, m.infraRetries,
		m.inboxRuns, m.inboxSeconds, m.inboxDead, m.httpRequests, m.httpSeconds,
		m.guardCalls, m.guardSeconds, m.heartbeat,
	}
	for i, c := range collectors {
		if err := reg.Register(c); err != nil {
			for _, done := range collectors[:i] {
				reg.Unregister(done)
			}
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return nil, fmt.Errorf("idemprom: metrics with namespace %q are already registered (create one Metrics per registry and share it): %w", o.Namespace, err)
			}
			return nil, fmt.Errorf("idemprom: registering metrics: %w", err)
		}
	}
	for _, name := range o.Consumers {
		m.consumerLabel(name)
	}
	return m, nil
}

func validNamespace(ns string) bool {
	for i, c := range ns {
		letter := c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
		if !letter && (i == 0 || c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// consumerLabel returns the bounded label for a consumer name and, the first
// time it is seen, creates its delivery and dead-letter series at zero:
// increase() cannot see a counter's first increment if the series only
// appears with it.
func (m *Metrics) consumerLabel(name string) string {
	label, first := m.consumers.Label(name)
	if first {
		for _, o := range hooklabel.ConsumeOutcomes() {
			m.deliveries.WithLabelValues(label, o.String())
		}
		m.deadLetters.WithLabelValues(label, string(idem.DeadMaxAttempts))
		m.infraRetries.WithLabelValues(label)
	}
	return label
}

// The hooks. Metrics implements only the end hooks: counting and timing
// need nothing at the start, and a start hook that returns its context
// unchanged would still make every component set one up.
var (
	_ idem.DoEndHook          = (*Metrics)(nil)
	_ consume.DeliveryEndHook = (*Metrics)(nil)
	_ inbox.RunEndHook        = (*Metrics)(nil)
	_ idemhttp.RequestEndHook = (*Metrics)(nil)
)

// For returns Metrics that share m's collectors and label Guard calls
// guard=name (bounded by [Options.MaxLabelValues]). Give each Guard (and
// each idemhttp middleware, whose Guard reports through its hooks) a name
// of its own: Hooks: []idem.Hook{m.For("payments-gateway")}. Metrics not
// made by For label them guard="default". The name labels nothing else:
// consumers carry their own name, and the HTTP and inbox metrics have no
// component label.
func (m *Metrics) For(name string) *Metrics {
	c := *m
	c.guard, _ = m.guards.Label(name)
	return &c
}

// OnDeliveryEnd implements consume.DeliveryEndHook: one delivery by
// consumer and outcome, and its dead-letter reason or infrastructure
// retry. The message id and dedupe key are never labels.
func (m *Metrics) OnDeliveryEnd(_ context.Context, ev consume.Event) {
	consumer := m.consumerLabel(ev.Consumer)
	outcome := hooklabel.Outcome(ev.Outcome)
	m.deliveries.WithLabelValues(consumer, outcome).Inc()
	m.handle.WithLabelValues(consumer, outcome).Observe(ev.Duration.Seconds())
	switch ev.Outcome {
	case idem.DeadLettered:
		m.deadLetters.WithLabelValues(consumer, hooklabel.DeadReason(ev.Reason)).Inc()
	case idem.Retried:
		if ev.Infrastructure {
			m.infraRetries.WithLabelValues(consumer).Inc()
		}
	}
}

// OnRunEnd implements inbox.RunEndHook: one run by event type and outcome,
// and its dead-letter reason. The event type is a label, bounded by
// [Options.MaxLabelValues]; the source, message id and ordering key never
// are. Runs that did not execute a handler (released rows, leases lost
// before the run) are counted but not timed.
func (m *Metrics) OnRunEnd(_ context.Context, ev inbox.Event) {
	typ, _ := m.types.Label(ev.Message.Type)
	outcome := hooklabel.Outcome(ev.Outcome)
	m.inboxRuns.WithLabelValues(typ, outcome).Inc()
	if ev.Duration > 0 {
		m.inboxSeconds.WithLabelValues(typ, outcome).Observe(ev.Duration.Seconds())
	}
	if ev.Outcome == idem.DeadLettered {
		m.inboxDead.WithLabelValues(typ, hooklabel.DeadReason(ev.DeadReason)).Inc()
	}
}

// OnRequestEnd implements idemhttp.RequestEndHook: one request by outcome
// and status class. The idempotency key, scope (or its hash), principal
// and URL path are never labels; the route is added only with
// [Options.HTTPRoute].
func (m *Metrics) OnRequestEnd(_ context.Context, ev idemhttp.Event) {
	outcome := hooklabel.Outcome(ev.Outcome)
	class := hooklabel.StatusClass(ev.Status)
	if !m.route {
		m.httpRequests.WithLabelValues(outcome, class).Inc()
		m.httpSeconds.WithLabelValues(outcome).Observe(ev.Duration.Seconds())
		return
	}
	route := "none"
	if ev.Request != nil && ev.Request.Pattern != "" {
		route, _ = m.routes.Label(ev.Request.Pattern)
	}
	m.httpRequests.WithLabelValues(outcome, class, route).Inc()
	m.httpSeconds.WithLabelValues(outcome, route).Observe(ev.Duration.Seconds())
}

// OnDoEnd implements idem.DoEndHook: one Guard.Do call by guard name (see
// [Metrics.For]) and outcome, and the slowest heartbeat of an execution
// that sent one. The scope and key are never labels.
func (m *Metrics) OnDoEnd(_ context.Context, ev idem.DoEvent) {
	outcome := hooklabel.Outcome(ev.Outcome)
	m.guardCalls.WithLabelValues(m.guard, outcome).Inc()
	m.guardSeconds.WithLabelValues(m.guard, outcome).Observe(ev.Duration.Seconds())
	if ev.Heartbeats > 0 {
		m.heartbeat.WithLabelValues(m.guard).Observe(ev.SlowestHeartbeat.Seconds())
	}
}
