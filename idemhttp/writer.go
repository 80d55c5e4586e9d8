package idemhttp

import (
	"bytes"
	"fmt"
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
type captureWriter struct {
	rw        http.ResponseWriter
	m         *Middleware
	limit     int
	status    int
	header    http.Header // allow-listed headers, snapshotted at WriteHeader
	body      bytes.Buffer
	over      bool // the body exceeded limit; the copy was dropped
	streaming bool // the status line went out; writes pass straight through
	release   bool // set by Release: do not store, release the key
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
		if c.streaming {
			c.rw.WriteHeader(code) // let net/http report the superfluous call
		}
		return
	}
	// Informational responses are not final: pass them on, remember nothing.
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		c.rw.WriteHeader(code)
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
	return c.rw.Write(p)
}

// stream sends the status and whatever was held back, and from then on
// passes writes through.
func (c *captureWriter) stream() {
	if c.streaming {
		return
	}
	c.streaming = true
	c.rw.WriteHeader(c.status)
	if c.body.Len() > 0 {
		_, _ = c.rw.Write(c.body.Bytes())
	}
}

// commit sends a held-back response once its record is written.
func (c *captureWriter) commit() {
	if c.status != 0 {
		c.stream()
	}
}

// FlushError flushes through to the client, switching to streaming.
// http.ResponseController finds it first; the rest of the controller's
// methods reach the underlying writer through Unwrap.
func (c *captureWriter) FlushError() error {
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
	}
	c.stream()
	return http.NewResponseController(c.rw).Flush()
}

// Flush implements http.Flusher for handlers that assert it directly.
func (c *captureWriter) Flush() { _ = c.FlushError() }

// Unwrap returns the wrapped writer, for http.ResponseController.
func (c *captureWriter) Unwrap() http.ResponseWriter { return c.rw }

// finalStatus is the status the client gets: 200 if the handler wrote nothing.
func (c *captureWriter) finalStatus() int {
	if c.status == 0 {
		return http.StatusOK
	}
	return c.status
}

// Release marks the request being handled so that, when its handler
// returns, the key is released (a retry runs the handler again) instead of
// its response being stored, whatever its status. Use it for failures the
// storage policy cannot see, such as a 4xx caused by a transient condition.
// w must be the writer the middleware passed to the handler, or wrap it
// with an Unwrap method. Release reports whether it found the middleware's
// writer.
func Release(w http.ResponseWriter) bool {
	for {
		switch v := w.(type) {
		case *captureWriter:
			v.release = true
			return true
		case interface{ Unwrap() http.ResponseWriter }:
			w = v.Unwrap()
		default:
			return false
		}
	}
}
