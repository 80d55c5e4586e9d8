// Package idemhttp is net/http middleware implementing the Idempotency-Key
// header (IETF draft "The Idempotency-Key HTTP Header Field", with Stripe's
// semantics) on top of [idem.Guard] and any durable [idem.Store], and the
// reverse proxy behind the `idem proxy` sidecar.
//
// # Behaviour
//
// For a covered method (POST and PATCH by default) carrying a key:
//
//   - the key header is parsed as an RFC 8941 sf-string ("abc"); a bare
//     token is accepted; two key headers or an invalid key get 400 before
//     the store is touched;
//   - the key is scoped by the authenticated principal (Config.Principal),
//     the method and the route, so one principal never receives another's
//     response; with no principal the request gets 400 unless
//     Config.SharedScope is set;
//   - the body is read within Config.MaxBodyBytes (413 otherwise) and
//     fingerprinted with the method, route, request URI and the configured
//     significant headers; JSON bodies are canonicalised first, so member
//     order and white space do not matter;
//   - the first request claims the key, runs the handler under a
//     heartbeating lease, stores the status, the allow-listed headers and
//     the body, and then responds;
//   - a retry after completion gets the identical status, stored headers
//     and body, plus "Idempotent-Replayed: true";
//   - a retry while the first is in flight gets 409 with Retry-After, or
//     with Config.Wait waits for the first and then replays;
//   - the same key with a different request gets 422, the record untouched.
//
// Set-Cookie, Authorization, WWW-Authenticate, Proxy-Authenticate, Date,
// Retry-After, rate-limit and hop-by-hop headers are never stored or
// replayed.
//
// # Storage policy
//
// [DefaultShouldStore] keeps 2xx, 3xx and deterministic 4xx responses and
// releases the key after 5xx, 408, 409, 425 and 429 and after a panic, so
// a retry runs the handler again. A handler can force a release with
// [Release].
//
// A response larger than Config.MaxResponseBytes (or than the store's own
// result limit) still reaches the first caller in full, but the key becomes
// a tombstone: retries get 410 Gone with type [TypeResultDiscarded] and the
// handler never runs again for that key. 410 rather than 409 because the
// condition is permanent: a client must not keep retrying.
//
// # Errors
//
// Every error is an RFC 9457 application/problem+json response whose type
// is one of the stable Type* URIs. Config.ErrorHandler replaces the writer.
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
// 409 and then the replay. If the store fails after the handler ran, the
// response is still sent, the key stays in progress until its lease
// expires and a later retry runs the handler again: handlers that call
// external systems should pass on a key derived with [idem.DownstreamKey].
//
// # Placement and leases
//
// Put the middleware after authentication, so Config.Principal can read
// the principal, and around each route's handler (mux.Handle(pattern,
// mw.Handler(h))) so the default route is the ServeMux pattern; wrapped
// around the whole mux it sees no pattern and scopes by URL path instead.
//
// The lease is heartbeated every Lease/3. It must comfortably exceed the
// store's worst write latency under load: if a burst of claims queues the
// heartbeat (SQLite has one writer) past the lease, another retry takes
// over and runs the handler a second time; fencing tokens then stop the
// first run from overwriting the record, but the effect happened twice.
// The 30 s default leaves a wide margin; leases of 1 s work on a store
// that is not saturated.
//
// # Proxy
//
// [NewProxy] puts the middleware in front of an upstream URL with
// httputil.ReverseProxy: the Idempotency-Key header is forwarded unchanged,
// a client-supplied Idempotent-Replayed header is stripped, and an
// unreachable upstream (502) or a timeout (504) releases the key.
package idemhttp
