// Package idemotel exports idem's hooks as OpenTelemetry metrics and spans.
//
// It lives in its own module so that the idem core stays free of the
// OpenTelemetry dependency. Create one [Telemetry] with [New], then pass
// it in the Hooks of every component you run, beside idemprom's Metrics or
// your own hooks if you have them: it implements the start and end hooks
// of each (idem.DoStartHook and DoEndHook, consume.DeliveryStartHook and
// DeliveryEndHook, inbox.RunStartHook and RunEndHook,
// idemhttp.RequestStartHook and RequestEndHook, outbox.PublishStartHook
// and PublishEndHook).
//
//	tel, err := idemotel.New(&idemotel.Options{MeterProvider: mp, TracerProvider: tp})
//	…
//	engine, err := consume.New(process, &consume.Config{Name: "payments", Hooks: []idem.Hook{metrics, tel}})
//	worker, err := inbox.NewWorker(backend, &inbox.Config{Hooks: []idem.Hook{metrics, tel}})
//	mw, err := idemhttp.New(store, &idemhttp.Config{Hooks: []idem.Hook{metrics.For("api"), tel.For("api")}})
//	guard := idem.NewGuard(store, &idem.GuardConfig{Hooks: []idem.Hook{metrics.For("payments-gateway"), tel.For("payments-gateway")}})
//	relay, err := outbox.NewRelay(store.Outbox(), publisher, &outbox.Config{Hooks: []idem.Hook{metrics.For("orders"), tel.For("orders")}})
//
// [Telemetry.For] names the Guard calls (idem.guard) and an outbox relay's
// batches (idem.relay); the middleware passes its hooks to its Guard, so
// its executions are reported as idem.guard=api there, and a Telemetry not
// made by For reports them as idem.guard=default and idem.relay=default.
// Consumers carry their own Config.Name.
//
// Nil providers mean the otel globals, which forward to the providers you
// set later with otel.SetMeterProvider and otel.SetTracerProvider, so New
// may run first.
//
// # Metrics
//
// The meter's and the tracer's instrumentation scope is [ScopeName], with
// the schema URL of the semantic conventions v1.43.0:
//
//	idem.consumer.deliveries{idem.consumer,idem.outcome}                   counter   {delivery}
//	idem.consumer.handle.duration{idem.consumer,idem.outcome}              histogram s
//	idem.consumer.dead_letters{idem.consumer,idem.dead_letter.reason}      counter   {delivery}
//	idem.consumer.infrastructure_retries{idem.consumer}                    counter   {delivery}
//	idem.inbox.runs{idem.inbox.type,idem.outcome}                          counter   {run}
//	idem.inbox.run.duration{idem.inbox.type,idem.outcome}                  histogram s
//	idem.inbox.dead_letters{idem.inbox.type,idem.dead_letter.reason}       counter   {run}
//	idem.http.requests{idem.outcome,idem.http.status_class[,route]}        counter   {request}
//	idem.http.request.duration{idem.outcome[,route]}                       histogram s
//	idem.guard.calls{idem.guard,idem.outcome}                              counter   {call}
//	idem.guard.call.duration{idem.guard,idem.outcome}                      histogram s
//	idem.outbox.events{idem.relay,idem.outcome[,topic]}                    counter   {event}
//	idem.outbox.publish.duration{idem.relay,idem.outcome}                  histogram s
//	idem.outbox.lag{idem.relay[,topic]}                                    histogram s
//	idem.outbox.dead_letters{idem.relay,idem.dead_letter.reason[,topic]}   counter   {event}
//
// where route is http.route and http.request.method, with
// [Options.HTTPRoute], and topic is messaging.destination.name, for the
// topics listed in [Options.OutboxTopics] (any other reads "other"). Outcomes are idem.Outcome values, one vocabulary
// for every component: a consumer reports processed, duplicate, retried,
// dead_lettered, requeued, abandoned or panicked; the inbox processed,
// retried, dead_lettered, lease_lost, released, abandoned or panicked; the
// HTTP middleware processed, duplicate, released, in_progress, mismatch,
// discarded, rejected, error, panicked, tombstoned, canceled, not_recorded
// or in_doubt, with status classes 1xx to 5xx; a Guard processed,
// duplicate, released, in_progress, mismatch, lease_lost, not_recorded,
// panicked, rejected or error; an outbox relay processed (confirmed and
// marked sent), retried, dead_lettered, lease_lost, not_recorded
// (confirmed but not marked sent: published again under the same id),
// released (a hard stop) or panicked. Dead-letter reasons are
// idem.DeadReason values. Anything else is reported as "other", so a new outcome in idem
// never creates unexpected series. These are the metrics of the idemprom
// package, under OpenTelemetry names.
//
// Durations are in seconds, with the boundaries 5ms to 10s that the
// semantic conventions recommend for request durations ([Options.Buckets]
// or an SDK view change them); they record the duration the component
// reports. Runs that did not execute a handler (released inbox rows,
// leases lost before the run) are counted but not timed. Measurements are
// made in the context of the span the end hook has just ended, so an SDK
// that samples exemplars links them to it.
//
// The outbox metrics are per event, once per publish attempt:
// idem.outbox.publish.duration is the time the relay spent on the event's
// batch once claimed, the publish and then the sent or failed mark
// (Result.Duration); idem.outbox.lag (boundaries 10ms to
// an hour, [Options.LagBuckets]) the time from the event's creation to
// the relay marking it sent, measured for sent events only. The creation
// time is the store's (on PostgreSQL and MySQL the database's clock, on
// PostgreSQL the start of the producer's transaction) and the end this
// process's clock, so clock skew shifts the lag; a negative one counts as
// zero. The counters of the relays in [Options.Relays] are recorded at
// zero by New, as for consumers.
//
// A consumer's delivery counters are recorded at zero the first time the
// consumer is seen, and at New for the names in [Options.Consumers], so
// that an alert on the rate of dead_lettered sees the first dead letter
// after a restart. As with idemprom, zero dead letters is the normal
// state: alert on any.
//
// # Spans
//
// Each start hook starts a span, a child of the span in the component's
// context, and returns a context holding it: the work runs with that
// context, so the spans the handler (or the guarded function, or the
// proxy's upstream call) starts are its children. The end hook ends it,
// once, also when the work panics. The spans nest as the components do: an
// idem.http span holds the idem.guard span of the middleware's Guard,
// which holds the handler's spans.
//
//	idem.consume  kind consumer  child of the span in Handle's context (the broker adapter's)
//	idem.inbox    kind consumer  child of the span in the worker's context (Run, RunOnce)
//	idem.http     kind internal  child of the span in r.Context() (otelhttp's server span)
//	idem.guard    kind internal  child of the span in Do's context
//	idem.outbox   kind client    child of the span in the relay's context (Start's, RunOnce's), one per batch
//
// Their attributes:
//
//	idem.consume  idem.consumer, idem.outcome, idem.attempt, messaging.message.id,
//	              messaging.operation.type=process; idem.dead_letter.reason when
//	              dead-lettered; idem.retry.delay (seconds) and
//	              idem.retry.infrastructure when retried
//	idem.inbox    idem.inbox.type, idem.inbox.source, idem.outcome, idem.attempt,
//	              messaging.message.id, messaging.operation.type=process;
//	              idem.dead_letter.reason when dead-lettered
//	idem.http     idem.outcome, http.response.status_code, http.route (when a
//	              ServeMux pattern matched), idem.scope_hash
//	idem.guard    idem.guard (the name given to For), idem.outcome,
//	              idem.scope_hash, idem.token, idem.takeover when set
//	idem.outbox   idem.relay (the name given to For), messaging.operation.type=send,
//	              messaging.batch.message_count, messaging.destination.name when
//	              the batch has one topic, idem.outbox.<outcome> (the number of
//	              events per outcome: idem.outbox.processed, …), idem.outcome
//	              when every event had the same one; one span event
//	              idem.outbox.message per event: messaging.message.id,
//	              messaging.destination.name, idem.outcome, idem.attempt,
//	              idem.dead_letter.reason when dead, error.type when failed
//
// The idem.outbox span starts when the relay hands the batch to the
// publisher (whose spans are its children) and ends with the last event's
// end hook, after the relay has recorded the outcomes. Its kind is client,
// as the semantic conventions ask of a send whose span is not the
// messages' creation context (the relay puts no trace context in the
// messages). An SDK keeps 128 events per span by default
// (sdktrace.WithSpanLimits raises it): a batch beyond that keeps its first
// 128 span events, and its idem.outbox.<outcome> counts stay exact.
//
// The attributes known when the work starts (names, ids, attempt, route,
// scope hash) are set by the start hook, so that a sampler sees them; the
// outcome and what follows from it by the end hook.
//
// The status is Error for outcomes that mean the work is not done or went
// wrong:
//
//	consume  retried, dead_lettered, requeued (commit outcome unknown), panicked,
//	         and any outcome but abandoned whose event carries an error (a
//	         failed ack)
//	inbox    retried, dead_lettered, lease_lost, panicked, and any outcome but
//	         released and abandoned with an error
//	http     error, panicked, not_recorded, in_doubt, and any 5xx status (a
//	         released 503 is an error, a released 429 is not)
//	guard    released (fn failed), lease_lost, not_recorded, panicked, error,
//	         and an unknown outcome with an error
//	outbox   any event retried, dead_lettered, lease_lost, not_recorded or
//	         panicked (the description counts them: "retried 2, dead_lettered 1
//	         of 100"; error.type is the first failure's); released is not
//
// Everything else is Unset: processed, a duplicate, a replay, a client's
// mistake (mismatch, in_progress, rejected), a client that went away
// (canceled), a delivery or row abandoned or a row released because the
// process is stopping, a Guard execution whose Final error was stored (the
// error is the call's result). An error span carries error.type: the error's type as
// semconv.ErrorType gives it (the value of an ErrorType() string method in
// the error's chain, else the Go type), else the 5xx status code, else
// "_OTHER". Any reported error, failure or not, adds an exception event
// with its exception.type.
//
// # Cardinality and privacy
//
// Every metric attribute comes from a small fixed set or from names in
// your code (consumer names, inbox event types, ServeMux patterns, Guard
// and relay names, the outbox topics you list), and the free-form ones are capped by [Options.MaxLabelValues]. The
// idempotency key, the message id, the inbox source and ordering key, the
// scope and its hash, the principal and the URL path are never metric
// attributes: each is unbounded and would create a series per request, and
// each may carry customer data. The route is opt-in ([Options.HTTPRoute])
// and is the path of r.Pattern, the ServeMux pattern that matched ("POST
// /payments/{id}" gives "/payments/{id}"), never r.URL.Path; it is only
// set when the middleware is registered inside the mux
// (mux.Handle(pattern, mw.Handler(h))), and left out otherwise.
//
// Spans are per request, so they carry the message id and the scope hash
// (a Guard's is computed as idemhttp's, so the two match). They carry the
// idempotency key (idem.key), the inbox ordering key
// (idem.inbox.ordering_key), an outbox event's key (idem.outbox.key) and a
// Guard call's scope (idem.scope) only with [Options.RecordKeys], and error
// messages only with [Options.RecordErrorMessages]: keys often name an
// order or an account, and idem's own errors quote the scope and the key
// (an HTTP scope holds the principal). Without RecordErrorMessages, the
// status description is the outcome ("dead_lettered: max_attempts",
// "released: 503"). String values are made valid UTF-8 and cut to 1024
// bytes, since an exporter refuses a batch with invalid UTF-8 and a
// dead-lettered invalid id is reported as it came.
//
// # Limitations
//
// An inbox run's span is a child of the worker's context, not of the
// producer's trace: the row carries no trace context. Carry one in the
// payload and link it from your handler if you need that connection. A
// span's extent is the hook calls', which is the component's work: an
// inbox row that is released or whose lease was lost before it ran makes
// a span of almost no length. An end hook called without its start hook
// (by a hand-written caller) makes a span of no length at that moment.
package idemotel
