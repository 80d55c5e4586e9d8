// Package idemprom exports idem's hooks as Prometheus metrics.
//
// It lives in its own module so that the idem core stays free of the
// Prometheus dependency. Create one [Metrics] per registry with [New], then
// pass it in the Hooks of every component you run: it implements the end
// hook of each (idem.DoEndHook, consume.DeliveryEndHook, inbox.RunEndHook,
// idemhttp.RequestEndHook, outbox.PublishEndHook).
//
//	m, err := idemprom.New(prometheus.DefaultRegisterer, nil)
//	…
//	engine, err := consume.New(process, &consume.Config{Name: "payments", Hooks: []idem.Hook{m}})
//	worker, err := inbox.NewWorker(backend, &inbox.Config{Hooks: []idem.Hook{m}})
//	mw, err := idemhttp.New(store, &idemhttp.Config{Hooks: []idem.Hook{m.For("api")}})
//	guard := idem.NewGuard(store, &idem.GuardConfig{Hooks: []idem.Hook{m.For("payments-gateway")}})
//	relay, err := outbox.NewRelay(store.Outbox(), publisher, &outbox.Config{Hooks: []idem.Hook{m.For("orders")}})
//
// [Metrics.For] names the Guard calls (the guard label) and the outbox
// relay's events (the relay label); the middleware passes its hooks to its
// Guard, so its executions count as guard="api" there. Consumers are
// labelled by their own Config.Name.
//
// A second New on the same registry with the same namespace fails with an
// error wrapping prometheus.AlreadyRegisteredError, and registers nothing.
//
// # Metrics
//
// With the default namespace "idem":
//
//	idem_consumer_deliveries_total{consumer,outcome}           counter
//	idem_consumer_handle_seconds{consumer,outcome}             histogram
//	idem_consumer_dead_letters_total{consumer,reason}          counter
//	idem_consumer_infrastructure_retries_total{consumer}       counter
//	idem_inbox_runs_total{type,outcome}                        counter
//	idem_inbox_run_seconds{type,outcome}                       histogram
//	idem_inbox_dead_letters_total{type,reason}                 counter
//	idem_http_requests_total{outcome,status_class[,route]}     counter
//	idem_http_request_duration_seconds{outcome[,route]}        histogram
//	idem_guard_calls_total{guard,outcome}                      counter
//	idem_guard_call_seconds{guard,outcome}                     histogram
//	idem_guard_heartbeat_max_seconds{guard}                    histogram
//	idem_outbox_events_total{relay,outcome[,topic]}            counter
//	idem_outbox_publish_seconds{relay,outcome}                 histogram
//	idem_outbox_lag_seconds{relay[,topic]}                     histogram
//	idem_outbox_dead_letters_total{relay,reason[,topic]}       counter
//
// idem_guard_heartbeat_max_seconds is the slowest lease heartbeat of each
// execution that sent one: alert when it approaches a third of the lease,
// the point where the lease can expire while the operation still runs.
//
// Outcomes are idem.Outcome values, one vocabulary for every component:
// a consumer reports processed, duplicate, retried, dead_lettered,
// requeued, abandoned or panicked; the inbox processed, retried,
// dead_lettered, lease_lost, released, abandoned or panicked; the HTTP
// middleware processed, duplicate,
// released, in_progress, mismatch, discarded, rejected, error, panicked,
// tombstoned, canceled, not_recorded or in_doubt, with status classes 1xx
// to 5xx; a Guard processed, duplicate, released, in_progress, mismatch,
// lease_lost, not_recorded, panicked, rejected or error; an outbox relay
// processed (confirmed by the broker and marked sent), retried,
// dead_lettered, lease_lost, not_recorded (confirmed but not marked sent:
// it goes out again under the same id), released (a hard stop) or
// panicked. Dead-letter reasons are idem.DeadReason values (an outbox
// event's: max_attempts or permanent). Anything else is reported as
// "other", so a new outcome in idem never creates unexpected series.
//
// # The outbox relay
//
// idem_outbox_events_total counts every event of every batch a relay
// published, once per attempt: an event retried twice and then sent
// counts retried twice and processed once. idem_outbox_publish_seconds is
// the time the relay spent on the event's batch once claimed: the
// publish, then the sent or failed mark (Result.Duration; the claim's own
// query is not in it), observed once per event (so its quantiles are per
// event, and a batch of 100 weighs 100 times). idem_outbox_lag_seconds is
// the time from the event's creation to the relay marking it sent,
// observed once per event sent: it is what a consumer waits beyond the
// producer's commit, and grows with a backlog, a broker that is down (the
// retries' backoff) or a relay that is not running. Its buckets
// ([Options.LagBuckets], default [DefaultLagBuckets]) reach an hour. The
// creation time is the store's (on PostgreSQL and MySQL the database
// server's clock, on PostgreSQL the start of the producer's transaction)
// and the end is this process's clock, so clock skew shifts the lag; a
// negative one counts as zero.
//
// The topic is a label only for the topics listed in
// [Options.OutboxTopics] (others read "other"), and the relay label is the
// name given to [Metrics.For] ("default" otherwise). List relay names in
// [Options.Relays] to create their series at zero at New, as for
// consumers.
//
//   - alert: IdemOutboxDead
//     expr: increase(idem_outbox_dead_letters_total[5m]) > 0
//   - alert: IdemOutboxLagging
//     expr: histogram_quantile(0.99, sum by (relay, le) (rate(idem_outbox_lag_seconds_bucket[5m]))) > 60
//
// A relay that publishes nothing observes no lag at all; alert on the
// outbox's own backlog too ("idem outbox stats", Admin.Stats: the age of
// the oldest pending event).
//
// # Cardinality and privacy
//
// Every label comes from a small fixed set or from names in your code
// (consumer names, inbox event types, ServeMux patterns, Guard and relay
// names, the outbox topics you list), and the free-form ones are capped by
// [Options.MaxLabelValues]. The idempotency key, the message id (and an
// outbox event's id, key and payload), the scope and its hash, the principal and the URL path are
// never labels: each is unbounded, so it would create a series per request
// and exhaust Prometheus, and each may carry customer data that must not
// leave the service in metrics. Log them (idemhttp.Event.ScopeHash is
// meant for logs) if you need them.
//
// The route label is opt-in ([Options.HTTPRoute]) and uses r.Pattern, the
// ServeMux pattern that matched ("POST /payments/{id}"), never r.URL.Path.
// It is only set when the middleware is registered inside the mux
// (mux.Handle(pattern, mw.Handler(h))); otherwise it reads "none".
//
// # Alerting on dead letters
//
// Zero dead letters is the normal state, so alert on any increase:
//
//   - alert: IdemDeadLetters
//     expr: increase(idem_consumer_deliveries_total{outcome="dead_lettered"}[5m]) > 0
//     labels:
//     severity: page
//     annotations:
//     summary: "{{ $labels.consumer }} dead-lettered messages"
//
// idem_consumer_dead_letters_total says why (max_attempts, permanent,
// mismatch, missing_id, invalid_id). increase() only sees a counter's
// first increment if the series existed before at zero. idemprom creates a
// consumer's series at zero on its first delivery, which is too late when
// that delivery is itself the dead letter; list your consumers in
// [Options.Consumers] to create them at New, so that a dead letter right
// after a restart is not missed.
//
// The inbox counts its dead letters the same way, by event type and
// reason (max_attempts, permanent, no_handler) in
// idem_inbox_dead_letters_total; "idem inbox dead" lists them.
//
// A growing rate of outcome="retried" with idem_consumer_infrastructure_retries_total
// flat points at the handler; with it rising, at the store or the broker.
package idemprom
