// Package idem makes effects exactly-once over at-least-once delivery.
//
// Every broker delivers at least once and every HTTP client retries after a
// lost response, so duplicates are the steady state. idem turns "the same
// message or request, again" into "the same effect, once", by keeping one
// durable record per (scope, key) in a store you already run.
//
// # The state machine
//
// Every feature is the same state machine over one record:
//
//	(absent) --claim--> in_progress{token, lease} --complete--> completed{fingerprint, result}
//	    ^                     |  lease expired: next claim takes over with a higher token
//	    +------release--------+
//
// A [Store] claims a key with a lease (Outcome [Acquired]); every claim gets a
// fencing token strictly greater than any earlier one for that key, and only
// the current token may Complete, Release or Extend (else [ErrLeaseLost]).
// Lease and retention expiry are computed by the store's clock. Every record
// keeps a [Fingerprint] of the content that created it, and a later call with
// the same key and different content is a [Mismatch].
//
// # Two paths
//
// The transactional path is the workhorse for effects in a SQL database.
// The SQL stores (store/idempgx, store/idemsqlite) implement [Processor],
// whose Process inserts the dedupe record and runs your effect in one
// transaction, so a duplicate is skipped atomically and concurrent
// duplicates are serialised by the database's unique key, never by a check
// in Go. The broker adapters accept any Processor.
//
// The lease path, [Guard.Do], works over any store for effects outside the
// database (HTTP handlers, calls to other services): claim, heartbeat while
// the function runs, store its result, replay it to every retry. The function
// receives its fencing token and a [Run.DownstreamKey] to pass to external
// APIs, which closes the "crashed after the external call, before recording
// it" window.
//
// # Multi-step operations
//
// An operation made of several steps with foreign calls in between (create
// a ride, charge the card, send the receipt) runs its steps through
// [Steps] inside [Guard.Do]: each completed step's result is recorded with
// the lease's fencing token, so a retry after a failure or a crash resumes
// after the last recorded step and never runs a recorded one again. A step
// is a foreign call ([Steps.Do], with its own [Step].DownstreamKey) or a
// transaction in the store's own database ([DoTx]: effect and step record
// commit together). Stores record steps through the optional [StepStore].
//
// # Keys, scopes and errors
//
// Keys are 1–255 bytes of printable ASCII ([ValidateKey]) and are rejected
// before any store is touched. A scope says whom a key belongs to: for HTTP
// the authenticated principal with method and route, for consumers the
// consumer name. Errors wrap the sentinels in errors.go with %w; use
// [errors.Is]. Transient infrastructure errors are marked with [Retryable].
//
// # Packages
//
// In this module:
//   - consume: the broker-agnostic consumer engine the broker adapters share.
//   - inbox: the inbox pattern (store now, process later with retries and
//     dead letters); inbox/inboxdriver is its contract with the databases.
//   - idemhttp: net/http Idempotency-Key middleware and the proxy behind `idem proxy`.
//   - retry: backoff with full jitter and error classification.
//   - storekit: for implementers of stores: the rules every store applies.
//   - idemtest: an in-memory store for unit tests (it says it is not durable);
//     idemtest/storetest: the conformance suite every store passes.
//
// Each in its own module, so that using one pulls in only its driver:
//   - store/idemsqlite, store/idempgx, store/idemredis: the stores.
//   - broker/idemamqp, broker/idemkafka, broker/idemnats: the broker
//     adapters (RabbitMQ, Kafka, NATS JetStream) over consume.
//   - contrib/idemotel, contrib/idemprom: OpenTelemetry and Prometheus hooks.
//   - cmd/idem: the CLI (demo, migrate, keys, proxy, inbox, dlq, backoff).
//   - shared: code the other modules share, with no compatibility promise.
package idem
