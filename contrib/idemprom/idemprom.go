package idemprom

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/outbox"
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

// defaultName labels the Guard calls and the relay events of Metrics not
// made by For.
const defaultName = "default"

// DefaultLagBuckets are the buckets, in seconds, of the outbox lag
// histogram unless [Options.LagBuckets] says otherwise: 10ms to an hour,
// since an event that waits for a retry or for a relay that is down is
// late by minutes, which the request-duration buckets would all put in
// +Inf.
var DefaultLagBuckets = []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}

// outboxOutcomes are the outcomes an outbox.Relay reports (see
// outbox.Result), whose series are created at zero for each relay.
var outboxOutcomes = [...]idem.Outcome{
	idem.Processed, idem.Retried, idem.DeadLettered, idem.LeaseLost, idem.NotRecorded, idem.Released, idem.Panicked,
}

// outboxDeadReasons are the reasons an outbox event goes to the dead state.
var outboxDeadReasons = [...]idem.DeadReason{idem.DeadMaxAttempts, idem.DeadPermanent}

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
	// Relays are relay names (as given to [Metrics.For]; "default" for
	// Metrics not made by For) whose outbox counters are created at zero by
	// New, so that an alert on increase() sees a relay's first dead event
	// after a restart. Relays not listed get their zero series on their
	// first published batch.
	Relays []string
	// OutboxTopics adds a topic label to the outbox event, dead-letter and
	// lag metrics: the topics listed here are labelled as themselves, any
	// other as [Other]. Without it (the default) there is no topic label.
	// Topics are listed rather than collected because a topic can be built
	// from data (a tenant, a queue URL per customer); list the bounded set
	// you alert on.
	OutboxTopics []string
	// LagBuckets are the buckets, in seconds, of the outbox lag histogram.
	// Default [DefaultLagBuckets].
	LagBuckets []float64
}

// Metrics holds the Prometheus collectors for idem's hooks, and is a hook
// itself: pass it (or [Metrics.For]) in the Hooks of every component's
// Config. Create it with [New]; it is safe for concurrent use.
type Metrics struct {
	route bool
	guard string // the guard label of Guard calls (For)
	relay string // the relay name of relay events (For), not yet bounded
	// topics are the topics of Options.OutboxTopics; nil: no topic label.
	topics map[string]bool

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
	outboxEvents *prometheus.CounterVec
	outboxSecs   *prometheus.HistogramVec
	outboxLag    *prometheus.HistogramVec
	outboxDead   *prometheus.CounterVec

	consumers, types, routes, guards, relays *hooklabel.Set
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
	if len(o.LagBuckets) == 0 {
		o.LagBuckets = DefaultLagBuckets
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
	histogramIn := func(buckets []float64, sub, name, help string, labels ...string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: o.Namespace, Subsystem: sub, Name: name, Help: help, ConstLabels: o.ConstLabels,
			Buckets: buckets,
		}, labels)
	}
	histogram := func(sub, name, help string, labels ...string) *prometheus.HistogramVec {
		return histogramIn(o.Buckets, sub, name, help, labels...)
	}
	// The outbox metrics carry a topic label only for listed topics.
	eventLabels, lagLabels, deadLabels := []string{"relay", "outcome"}, []string{"relay"}, []string{"relay", "reason"}
	var topics map[string]bool
	if len(o.OutboxTopics) > 0 {
		topics = make(map[string]bool, len(o.OutboxTopics))
		for _, tp := range o.OutboxTopics {
			topics[tp] = true
		}
		eventLabels, lagLabels, deadLabels = append(eventLabels, "topic"), append(lagLabels, "topic"), append(deadLabels, "topic")
	}
	m := &Metrics{
		route:  o.HTTPRoute,
		guard:  defaultName,
		relay:  defaultName,
		topics: topics,
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
		outboxEvents: counter("outbox", "events_total",
			"Outbox events an outbox.Relay published or tried to, by relay name and outcome.", eventLabels...),
		outboxSecs: histogram("outbox", "publish_seconds",
			"Time an outbox.Relay spent on each event's batch, from the claimed rows to the recorded outcome (publish, then the sent or failed mark), by relay name and outcome. One observation per event.", "relay", "outcome"),
		outboxLag: histogramIn(o.LagBuckets, "outbox", "lag_seconds",
			"Time from an outbox event's creation (the store's clock) to the relay marking it sent, by relay name. One observation per event sent.", lagLabels...),
		outboxDead: counter("outbox", "dead_letters_total",
			"Outbox events moved to the dead state, by relay name and reason. Normally zero.", deadLabels...),
		consumers: hooklabel.NewSet(o.MaxLabelValues),
		types:     hooklabel.NewSet(o.MaxLabelValues),
		routes:    hooklabel.NewSet(o.MaxLabelValues),
		guards:    hooklabel.NewSet(o.MaxLabelValues),
		relays:    hooklabel.NewSet(o.MaxLabelValues),
	}
	collectors := []prometheus.Collector{
		m.deliveries, m.handle, m.deadLetters, m.infraRetries,
		m.inboxRuns, m.inboxSeconds, m.inboxDead, m.httpRequests, m.httpSeconds,
		m.guardCalls, m.guardSeconds, m.heartbeat,
		m.outboxEvents, m.outboxSecs, m.outboxLag, m.outboxDead,
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
	for _, name := range o.Relays {
		m.relayLabel(name)
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

// relayLabel returns the bounded label for a relay name and, the first
// time it is seen, creates its event and dead-letter series at zero, for
// each listed topic when there is a topic label.
func (m *Metrics) relayLabel(name string) string {
	label, first := m.relays.Label(name)
	if first {
		topics := []string{""}
		if m.topics != nil {
			topics = topics[:0]
			for tp := range m.topics {
				topics = append(topics, tp)
			}
		}
		for _, tp := range topics {
			for _, o := range outboxOutcomes {
				m.outboxEvents.WithLabelValues(m.withTopic(tp, label, o.String())...)
			}
			for _, r := range outboxDeadReasons {
				m.outboxDead.WithLabelValues(m.withTopic(tp, label, string(r))...)
			}
		}
	}
	return label
}

// withTopic appends the topic label to values when the outbox metrics
// have one: topic itself if listed in Options.OutboxTopics, else [Other].
func (m *Metrics) withTopic(topic string, values ...string) []string {
	if m.topics == nil {
		return values
	}
	if !m.topics[topic] {
		topic = Other
	}
	return append(values, topic)
}

// The hooks. Metrics implements only the end hooks: counting and timing
// need nothing at the start, and a start hook that returns its context
// unchanged would still make every component set one up.
var (
	_ idem.DoEndHook          = (*Metrics)(nil)
	_ consume.DeliveryEndHook = (*Metrics)(nil)
	_ inbox.RunEndHook        = (*Metrics)(nil)
	_ idemhttp.RequestEndHook = (*Metrics)(nil)
	_ outbox.PublishEndHook   = (*Metrics)(nil)
)

// For returns Metrics that share m's collectors and label Guard calls
// guard=name and outbox relay events relay=name (each bounded by
// [Options.MaxLabelValues]). Give each Guard (and each idemhttp
// middleware, whose Guard reports through its hooks) and each
// outbox.Relay a name of its own: Hooks: []idem.Hook{m.For("payments-gateway")}.
// Metrics not made by For label them guard="default" and relay="default".
// The name labels nothing else: consumers carry their own name, and the
// HTTP and inbox metrics have no component label.
func (m *Metrics) For(name string) *Metrics {
	c := *m
	c.guard, _ = m.guards.Label(name)
	c.relay = name
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

// OnPublishEnd implements outbox.PublishEndHook: one outbox event by relay
// name (see [Metrics.For]) and outcome, the time its batch took, its
// dead-letter reason, and, when it was sent, its lag: the time from its
// creation to now, when the relay has marked it sent. The event id, key
// and payload are never labels, and the topic only with
// [Options.OutboxTopics].
//
// The lag subtracts the event's CreatedAt, which the store sets (on
// PostgreSQL and MySQL the database's clock, on PostgreSQL the start of
// the producer's transaction), from this process's clock; a negative
// difference (clock skew) counts as zero, and an event without a creation
// time is not observed. Events that are not sent (retried, dead, lease
// lost, not recorded, released) are not observed either: an event
// published again after a failure is observed once, when it is sent.
func (m *Metrics) OnPublishEnd(_ context.Context, r outbox.Result) {
	relay := m.relayLabel(m.relay)
	outcome := hooklabel.Outcome(r.Outcome)
	m.outboxEvents.WithLabelValues(m.withTopic(r.Message.Topic, relay, outcome)...).Inc()
	if r.Duration > 0 {
		m.outboxSecs.WithLabelValues(relay, outcome).Observe(r.Duration.Seconds())
	}
	switch r.Outcome {
	case idem.Processed:
		if !r.Message.CreatedAt.IsZero() {
			lag := max(time.Since(r.Message.CreatedAt), 0)
			m.outboxLag.WithLabelValues(m.withTopic(r.Message.Topic, relay)...).Observe(lag.Seconds())
		}
	case idem.DeadLettered:
		m.outboxDead.WithLabelValues(m.withTopic(r.Message.Topic, relay, hooklabel.DeadReason(r.DeadReason))...).Inc()
	}
}
