// Package idemhttp is net/http middleware implementing the Idempotency-Key
// header (IETF draft "The Idempotency-Key HTTP Header Field", with Stripe's
// semantics) on top of [idem.Guard] and any durable [idem.Store], and the
// reverse proxy behind the `idem proxy` sidecar.
//
// # Behaviour
//
// For a covered method (POST and PATCH by default, matched whatever their
// case) carrying a key:
//
//   - the key header is parsed as an RFC 8941 sf-string ("abc"); a bare
//     token is accepted; two key headers or an invalid key get 400 before
//     the store is touched;
//   - the key is scoped by the authenticated principal (Config.Principal),
//     the method and the route, so one principal never receives another's
//     response; with no principal, or a principal header sent twice, the
//     request gets 400 unless Config.SharedScope is set;
//   - the body is read within Config.MaxBodyBytes (413 otherwise, at once
//     for a declared Content-Length over the limit) and fingerprinted with
//     the method, route, request URI and the configured significant
//     headers; a gzip or deflate Content-Encoding is decoded first (within
//     the same limit) and JSON bodies are canonicalised, so compression,
//     member order and white space do not matter;
//   - the first request claims the key, runs the handler under a
//     heartbeating lease, stores the status, the allow-listed headers and
//     the body, and then responds;
//   - a retry after completion gets the identical status, stored headers
//     and body, plus "Idempotent-Replayed: true";
//   - a retry while the first is in flight gets 409 with Retry-After, or
//     with Config.Wait waits for the first and then replays;
//   - the same key with a different request gets 422, the record untouched.
//
// Every response to a request with a valid key echoes its Idempotency-Key
// header. Content-Type, Location, Content-Location, ETag, Last-Modified,
// Link, Request-Id and X-Request-Id are stored and replayed, with
// Config.ReplayHeaders besides; Set-Cookie, Authorization,
// WWW-Authenticate, Proxy-Authenticate, Date, Retry-After, rate-limit and
// hop-by-hop headers never are.
//
// # Executions outlive their clients
//
// Once the handler has started, the client going away (a dropped
// connection, a client-side timeout) neither cancels the handler's context
// nor releases the key: the handler runs to its end, its response is
// recorded, and the client's retry gets 409 while it runs and the replay
// after. Writes to a client that has gone succeed for the handler, so an
// event stream left early is still recorded whole. A client that leaves
// before its handler starts (while its claim or Wait is pending) stops
// everything, and nothing runs for it. Config.HandlerTimeout bounds the
// handler's context; Config.CancelOnDisconnect restores plain net/http's
// cancellation.
//
// A lost lease does not abort a running handler either: it may already
// have had its effect. Fencing refuses its record.
//
// # Storage policy
//
// [DefaultShouldStore] keeps 2xx, 3xx and deterministic 4xx responses and
// releases the key after 5xx, 408, 409, 425 and 429 and after a panic, so
// a retry runs the handler again. A handler can force a release with
// [Release], or force a response to be stored whatever its status with
// [Keep] (a 500 written after the effect happened).
//
// A response larger than Config.MaxResponseBytes (or than the store's own
// result limit) still reaches the first caller in full, but the key becomes
// a tombstone: retries get 410 Gone with type [TypeResultDiscarded] and the
// handler never runs again for that key. 410 rather than 409 because the
// condition is permanent: a client must not keep retrying. A protocol
// switch (101, a hijacked connection) is recorded the same way, with type
// [TypeResponseNotRecordable].
//
// # A result that cannot be recorded
//
// If the store fails while the response is recorded, the Guard retries
// while its lease holds; if it still cannot, or the lease was lost, the
// response is sent with "Idempotent-Recorded: false" (in a trailer when it
// was already streaming: a client that reads trailers sees it), the
// failure is logged, and the key stays claimed until its
// lease expires, so an immediate retry gets 409. A retry after the lease
// expired runs the handler again: handlers that call external systems
// should pass on a key derived with [idem.DownstreamKey].
//
// # Errors
//
// Every error is an RFC 9457 application/problem+json response whose type
// is one of the stable Type* URIs and whose "code" member is its short
// code. Config.ErrorFormat [FormatStripe] writes Stripe's error shape
// instead, so that Stripe-style SDKs raise typed errors (an
// idempotency_error for a reused or busy key) rather than retry, or
// resolve as a result, an answer they do not recognise.
// Config.ErrorHandler replaces the writer.
//
// # Durability
//
// [New] refuses a store that reports it is not durable
// ([idem.ErrNotDurable]): replaying responses from memory loses the
// guarantee at the first restart. Tests set Config.AllowNonDurable.
//
// # Response delivery
//
// The first response is held back until its record is written, so a client
// that has seen it always gets the replay on a retry. It is streamed
// instead, from that point on, when the handler flushes (server-sent
// events, progress output) or the body outgrows Config.MaxResponseBytes;
// a retry that arrives between the streamed response and its record gets
// 409 and then the replay.
//
// # Placement and leases
//
// Put the middleware after authentication, so Config.Principal can read
// the principal, and around each route's handler (mux.Handle(pattern,
// mw.Handler(h))) so the default route is the ServeMux pattern; wrapped
// around the whole mux it sees no pattern and scopes by URL path instead.
//
// The lease (at least [idem.MinLease]) is heartbeated every Lease/3 and
// must comfortably exceed the store's worst write latency under load.
// Every store gives lease holders a path of their own: idemsqlite puts
// their writes first in its write queue and commits those that queue
// together, idempgx keeps pool connections for them, idemredis sends each
// heartbeat from its caller at once. A hook implementing idem.DoEndHook
// sees each execution's slowest heartbeat (contrib/idemprom exports it):
// alert when it nears a third of the lease.
//
// # Finding a key
//
// A key is stored under the scope [Scope](principal, method, route):
// `http "<principal>" <METHOD> <route>`, the principal quoted (the proxy's
// is its --scope-header value, or "authz-sha256:" and the hex SHA-256 of
// the Authorization header). Logs and hooks carry only [idem.ScopeHash] of it.
// `idem keys get --scope 'http "alice" POST POST /pay' KEY` shows the
// stored response a retry is replayed, with the scope's parts and its
// hash; [DecodeStoredResponse] and [ParseScope] are the same from Go, and
// `idem keys delete` evicts the key (the next request runs again).
//
// # Hooks
//
// Config.Hooks takes the values that observe the middleware, as every idem
// component's Config does: a [RequestStartHook] is called as the handling
// of a covered request starts and returns the context the request is
// handled with (so a span it starts is the parent of the handler's spans,
// or of the proxy's upstream call), a [RequestEndHook] once at the end
// with the [Event]'s outcome, status and duration. The same hooks go to
// the Guard underneath, so one implementing idem.DoStartHook or
// idem.DoEndHook sees each execution attempt, and the handler's context
// carries what its start hook added. contrib/idemprom's Metrics implements
// the end hooks, contrib/idemotel's Telemetry the start and end hooks (its
// request span is the parent of the Guard's, which is the parent of the
// handler's spans):
//
//	mw, err := idemhttp.New(store, &idemhttp.Config{Hooks: []idem.Hook{metrics.For("api"), tel.For("api")}})
//
// # Proxy
//
// [NewProxy] puts the middleware in front of an upstream URL with
// httputil.ReverseProxy. The Idempotency-Key header is forwarded unchanged
// (and survives a client's Connection header, as do
// ProxyConfig.PreserveHeaders), a client-supplied Idempotent-Replayed
// header is stripped, and a request is forwarded at most once per key: the
// upstream call runs on a context the client's disconnect does not end
// (bounded by ProxyConfig.UpstreamTimeout), and the transport is kept from
// re-sending a request by itself after a broken keep-alive connection.
//
// Only a request of which nothing reached the upstream (connection
// refused, a reset before any byte of it left, a dial timeout) releases its
// key, with 502 or 504 and type [TypeUpstreamUnreachable] or
// [TypeUpstreamTimeout]. One that reached the upstream and got no whole
// answer (ProxyConfig.Timeout, UpstreamTimeout, a dropped connection, a
// response that broke off) is in doubt: with [InDoubtRecord], the default,
// a 502/504 of type [TypeOutcomeUnknown] is recorded and replayed to every
// retry, and the request is never forwarded again until an operator
// deletes the key; [InDoubtRelease] releases it instead, for upstreams that
// deduplicate by the forwarded key themselves. The one window left is a
// proxy killed between the upstream's answer and the record: its retry
// gets 409 until the lease expires and then runs again.
package idemhttp
