package idemhttp

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/http"
)

// captureWriter keeps a copy of a response's status, allow-listed headers
// and body (up to limit bytes) for the store.
//
// It holds the response back until the record is written (commit), so a
// client that has seen a response always gets the replay when it retries.
// It switches to streaming, passing everything through at once, when the
// handler flushes or the body outgrows limit; past the limit it stops
// copying, so the first caller still gets the full response.
//
// A client that has gone away does not stop the handler: once a write to
// it fails, writes and flushes still succeed for the handler and only the
// copy is kept, so the response is recorded whole and a retry replays it.
type captureWriter struct {
	rw        http.ResponseWriter
	m         *Middleware
	limit     int
	status    int
	header    http.Header // allow-listed headers, snapshotted at WriteHeader
	body      bytes.Buffer
	over      bool // the body exceeded limit; the copy was dropped
	streaming bool // the status line went out; writes pass straight through
	gone      bool // a write to the client failed: it has gone away
	hijacked  bool // the handler took the connection over (a protocol switch)
	release   bool // set by Release: do not store, release the key
	keep      bool // set by Keep: store whatever the status
	// inDoubt marks a response that says the outcome is unknown (the
	// proxy's upstream got the request and did not answer).
	inDoubt bool
	// stored, when set, is recorded instead of what the handler wrote, and
	// abort breaks the client's connection once it is recorded: the
	// handler's response broke off after part of it was sent.
	stored *storedResponse
	abort  bool
	// echo is the Idempotency-Key header value, echoed on the response.
	echo string
}

// Header implements http.ResponseWriter.
func (c *captureWriter) Header() http.Header { return c.rw.Header() }

// WriteHeader implements http.ResponseWriter.
func (c *captureWriter) WriteHeader(code int) {
	// net/http panics on these in the handler; so must the delayed write.
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	if c.status != 0 {
		if c.streaming && !c.gone {
			c.rw.WriteHeader(code) // let net/http report the superfluous call
		}
		return
	}
	// Informational responses are not final: pass them on, remember nothing.
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		if !c.gone {
			c.rw.WriteHeader(code)
		}
		return
	}
	c.status = code
	c.header = c.m.storableHeader(c.rw.Header())
}

// Write implements http.ResponseWriter.
func (c *captureWriter) Write(p []byte) (int, error) {
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
	}
	if !c.over {
		if c.body.Len()+len(p) > c.limit {
			c.over = true
			c.stream()
			c.body = bytes.Buffer{}
		} else {
			c.body.Write(p)
			if !c.streaming {
				return len(p), nil
			}
		}
	}
	c.send(p)
	return len(p), nil
}

// send writes p to the client unless it has gone away.
func (c *captureWriter) send(p []byte) {
	if c.gone || len(p) == 0 {
		return
	}
	if _, err := c.rw.Write(p); err != nil {
		c.gone = true
	}
}

// stream sends the status and whatever was held back, and from then on
// passes writes through.
func (c *captureWriter) stream() {
	if c.streaming {
		return
	}
	c.streaming = true
	if c.echo != "" {
		c.rw.Header().Set(c.m.header, c.echo)
	}
	c.rw.WriteHeader(c.status)
	c.send(c.body.Bytes())
}

// commit sends a held-back response once its record is written.
func (c *captureWriter) commit() {
	if c.status != 0 && !c.hijacked {
		c.stream()
	}
}

// FlushError flushes through to the client, switching to streaming.
// http.ResponseController finds it first; the rest of the controller's
// methods reach the underlying writer through Unwrap. It reports no error
// once the client has gone: the handler goes on and its response is
// recorded.
func (c *captureWriter) FlushError() error {
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
	}
	c.stream()
	if !c.gone {
		if err := http.NewResponseController(c.rw).Flush(); err != nil {
			c.gone = true
		}
	}
	return nil
}

// Flush implements http.Flusher for handlers that assert it directly.
func (c *captureWriter) Flush() { _ = c.FlushError() }

// Hijack hands the connection to the handler (a protocol switch such as a
// WebSocket upgrade). Such a response cannot be replayed: the key is
// recorded as completed without a response, and retries get 410.
func (c *captureWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(c.rw).Hijack()
	if err == nil {
		c.hijacked = true
	}
	return conn, brw, err
}

// Unwrap returns the wrapped writer, for http.ResponseController.
func (c *captureWriter) Unwrap() http.ResponseWriter { return c.rw }

// finalStatus is the status the client gets: 200 if the handler wrote nothing.
func (c *captureWriter) finalStatus() int {
	if c.status == 0 {
		return http.StatusOK
	}
	return c.status
}

// record is what the store keeps for this response, or nil when the key is
// to be released.
func (c *captureWriter) record() *storedResponse {
	switch {
	case c.stored != nil:
		return c.stored
	case c.hijacked:
		return &storedResponse{status: http.StatusSwitchingProtocols, discarded: true, upgraded: true}
	case c.release:
		return nil
	case !c.keep && !c.m.cfg.ShouldStore(c.finalStatus()):
		return nil
	case c.over:
		return &storedResponse{status: c.finalStatus(), discarded: true}
	}
	return &storedResponse{status: c.finalStatus(), header: c.header, body: c.body.Bytes()}
}

// capture finds the middleware's writer in w's chain of Unwrap methods.
func capture(w http.ResponseWriter) *captureWriter {
	for {
		switch v := w.(type) {
		case *captureWriter:
			return v
		case interface{ Unwrap() http.ResponseWriter }:
			w = v.Unwrap()
		default:
			return nil
		}
	}
}

// Release marks the request being handled so that, when its handler
// returns, the key is released (a retry runs the handler again) instead of
// its response being stored, whatever its status. Use it for failures the
// storage policy cannot see, such as a 4xx caused by a transient condition.
// w must be the writer the middleware passed to the handler, or wrap it
// with an Unwrap method. Release reports whether it found the middleware's
// writer.
func Release(w http.ResponseWriter) bool {
	c := capture(w)
	if c != nil {
		c.release, c.keep = true, false
	}
	return c != nil
}

// Keep marks the request being handled so that its response is stored and
// replayed whatever its status, overriding Config.ShouldStore: use it for a
// failure that happened after the effect, such as a 500 written once the
// payment went through, so that a retry gets that answer instead of a
// second run. w is as for [Release]; Keep reports whether it found the
// middleware's writer.
func Keep(w http.ResponseWriter) bool {
	c := capture(w)
	if c != nil {
		c.keep, c.release = true, false
	}
	return c != nil
}
