// Package faultnet is a fault-injecting TCP relay for tests: it sits on one
// hop of the wire and breaks that hop in a chosen way, so a test can say
// where a fault happens (between the client and a proxy, or between the
// proxy and its upstream) instead of faking it inside a handler.
//
//	client ──► Relay (127.0.0.1:port) ──► target (host:port)
//	           "request" bytes flow right, "response" bytes flow left
//
// [Start] listens on a free loopback port and relays every connection it
// accepts to the target. To break the client's hop, start the relay with
// the proxy as its target and point the client at [Relay.Addr] or
// [Relay.URL]; to break the upstream hop, start it with the upstream as its
// target and point the proxy at the relay.
//
// # Faults
//
// A [Fault] describes what the relay does to a connection; its zero value
// passes bytes through both ways untouched. Its fields combine:
//
//   - Refuse resets a connection as soon as it is accepted, without dialing
//     the target. (For "target down", point the relay at a closed port: the
//     client is reset the same way and Stats.DialFailed counts it.)
//   - RequestDelay and ResponseDelay hold every chunk for that long before
//     forwarding it, in that direction only.
//   - CutAfterRequest cuts the client once that many request bytes have
//     reached the target: the client sees its connection reset while the
//     target side stays open and is drained, so the server behind it sees
//     the request that reached it, no disconnect, and finishes its work.
//     CutTarget resets the target side too, so the server sees the client
//     vanish.
//   - Hang drops everything the target sends: the request is delivered, the
//     client waits for a response that never comes.
//   - CutAfterResponse forwards that many response bytes, then cuts: a
//     connection dying mid-response. With Hang, the bytes are dropped
//     instead, so the client is reset as the response starts.
//
// A cut resets the client (SO_LINGER 0, then close), so the client reads the
// bytes it was sent and then "connection reset by peer".
//
// [Relay.Set] changes the fault of every live connection and of every new
// one: delays, hangs and cut thresholds take effect from the next chunk, and
// cut thresholds count bytes from that point. [Relay.SetNext] gives a fault
// to the next n accepted connections only, after which new connections take
// the fault of the last Set again; "drop the first attempt, pass the retry"
// is SetNext(1, f).
//
// # Waiting without sleeping
//
// [Relay.Stats] counts connections and bytes; [Relay.Wait] blocks until the
// counters satisfy a condition, and [Relay.WaitForwarded] until a number of
// bytes have been written to the target, so a test can act exactly when a
// request has reached the server. Counters are updated after the event they
// count: when Stats.Cut says a connection was cut, its client has already
// been reset.
//
// # Go's HTTP client retries on its own
//
// net/http's Transport silently sends a request again on a new connection
// when a reused keep-alive connection fails before the first response byte
// and the request is replayable: a GET, HEAD, OPTIONS or TRACE, or a
// request with an Idempotency-Key (or X-Idempotency-Key) header whose body
// can be sent again (none, or GetBody set, as [net/http.NewRequest] does for
// in-memory bodies). A test that wants to see the client's first failure
// uses a fresh Transport (a new connection is never retried) or one with
// DisableKeepAlives.
//
// # Resources
//
// Every connection uses two fixed 32 KiB buffers and nothing else grows with
// traffic: bytes a fault withholds are read and dropped, never stored. A
// connection whose client was cut keeps its target side open until the
// target closes it or the relay closes. [Relay.Close] closes the listener and
// every live connection and returns once all of the relay's goroutines have
// exited.
package faultnet
