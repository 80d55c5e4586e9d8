// Package idemotel exports idem's hooks as OpenTelemetry metrics and spans.
//
// It lives in its own module so that the idem core stays free of the
// OpenTelemetry dependency. Create one [Telemetry] with [New], then plug
// its hooks into the components you run:
//
//	tel, err := idemotel.New(&idemotel.Options{MeterProvider: mp, TracerProvider: tp})
//	…
//	engine, err := consume.New(process, &consume.Config{Name: "payments", Hooks: tel.ConsumeHooks()})
//	worker, err := inbox.NewWorker(backend, &inbox.Config{OnEvent: tel.InboxHook()})
//	mw, err := idemhttp.New(store, &idemhttp.Config{OnRequest: tel.HTTPHook()})
//	guard := idem.NewGuard(store, &idem.GuardConfig{OnDo: tel.GuardHook("payments-gateway")})
//
// Nil providers mean the otel globals, which forward to the providers you
// set later with otel.SetMeterProvider and otel.SetTracerProvider, so New
// may run first. Each component takes one hook; [MultiConsumeHooks],
// [MultiInboxHook], [MultiHTTPHook] and [MultiGuardHook] combine
// idemotel's with idemprom's or your own.
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
//	idem.http.requests{idem.outcome,idem.http.status_class[,route]}        counter   {request}
//	idem.http.request.duration{idem.outcome[,route]}                       histogram s
//	idem.guard.calls{idem.guard,idem.outcome}                              counter   {call}
//	idem.guard.call.duration{idem.guard,idem.outcome}                      histogram s
//
// where route is http.route and http.request.method, with
// [Options.HTTPRoute]. The consumer outcomes are processed, duplicate,
// retried, dead_lettered, requeued and abandoned; dead-letter reasons are
// consume's Reason constants; inbox outcomes are processed, retried, dead,
// lease_lost and released; HTTP outcomes are idemhttp's Outcome values and
// status classes are 1xx to 5xx; Guard outcomes are idem's DoOutcome
// values (executed, replayed, failed, in_progress, mismatch, lease_lost,
// panic, rejected, error). Anything else is reported as "other", so a new
// outcome in idem never creates unexpected series. These are the
// metrics of the idemprom package, under OpenTelemetry names.
//
// Durations are in seconds, with the boundaries 5ms to 10s that the
// semantic conventions recommend for request durations ([Options.Buckets]
// or an SDK view change them). Runs that did not execute a handler
// (released inbox rows, leases lost before the run) are counted but not
// timed. Measurements are made in the context of the span the hook has
// just made, so an SDK that samples exemplars links them to it.
//
// A consumer's delivery counters are recorded at zero the first time the
// consumer is seen, and at New for the names in [Options.Consumers], so
// that an alert on the rate of dead_lettered sees the first dead letter
// after a restart. As with idemprom, zero dead letters is the normal
// state: alert on any.
//
// # Spans
//
// The hooks are called after the work, so each makes its span after the
// fact: it ends now and starts the reported duration earlier.
//
//	idem.consume  kind consumer  child of the span in the hook's context (the broker adapter's)
//	idem.inbox    kind consumer  a root: inbox events carry no context
//	idem.http     kind internal  child of the span in r.Context() (otelhttp's server span)
//	idem.guard    kind internal  child of the span in Do's context
//
// Their attributes:
//
//	idem.consume  idem.consumer, idem.outcome, idem.attempt, messaging.message.id,
//	              messaging.operation.type=process; idem.dead_letter.reason when
//	              dead-lettered; idem.retry.delay (seconds) and
//	              idem.retry.infrastructure when retried
//	idem.inbox    idem.inbox.type, idem.inbox.source, idem.outcome, idem.attempt,
//	              messaging.message.id, messaging.operation.type=process
//	idem.http     idem.outcome, http.response.status_code, http.route (when a
//	              ServeMux pattern matched), idem.scope_hash
//	idem.guard    idem.guard (the name given to GuardHook), idem.outcome,
//	              idem.scope_hash, idem.token, idem.takeover when set
//
// The status is Error for outcomes that mean the work is not done or went
// wrong:
//
//	consume  retried, dead_lettered, requeued (commit outcome unknown), and any
//	         outcome but abandoned whose event carries an error (a failed ack)
//	inbox    retried, dead, lease_lost, and any outcome with an error
//	http     error, panic, and any 5xx status (a released 503 is an error, a
//	         released 429 is not)
//	guard    failed, lease_lost, panic, error, and an unknown outcome with an
//	         error
//
// Everything else is Unset: processed, a duplicate, a replay, a client's
// mistake (mismatch, in_flight, rejected), a client that went away
// (canceled), a delivery abandoned or a row released because the process
// is stopping, a Guard execution whose Final error was stored (the error
// is the call's result). An error span carries error.type: the error's type as
// semconv.ErrorType gives it (the value of an ErrorType() string method in
// the error's chain, else the Go type), else the 5xx status code, else
// "_OTHER". Any reported error, failure or not, adds an exception event
// with its exception.type.
//
// # Cardinality and privacy
//
// Every metric attribute comes from a small fixed set or from names in
// your code (consumer names, inbox event types, ServeMux patterns, Guard
// names), and
// the free-form ones are capped by [Options.MaxLabelValues]. The
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
// (idem.inbox.ordering_key) and a Guard call's scope (idem.scope) only
// with [Options.RecordKeys], and error
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
// A span made after the fact cannot be the parent of the spans the
// handler itself creates: those are children of the hook's parent (the
// broker's or the server span) and siblings of idemotel's span, which has
// the same extent around them. Inbox spans are roots with nothing to
// connect them to the producer's trace or to the handler's spans (the
// worker's context holds no span); carry a trace context in the payload
// if you need that link. An inbox row that is released or whose lease was
// lost before it ran makes a span of no length.
package idemotel
