package idemhttp

import (
	"bytes"
	"net/http"
)

// captureWriter passes a response through to the client while keeping a
// copy of its status, its allow-listed headers and up to limit body bytes.
// Past the limit it stops copying but keeps passing through, so the first
// caller always gets the full response.
type captureWriter struct {
	rw      http.ResponseWriter
	m       *Middleware
	limit   int
	status  int
	header  http.Header // allow-listed headers, snapshotted at WriteHeader
	body    bytes.Buffer
	over    bool // the body exceeded limit; body was dropped
	release bool // set by Release: do not store, release the key
}

// Header implements http.ResponseWriter.
func (c *captureWriter) Header() http.Header { return c.rw.Header() }

// WriteHeader implements http.ResponseWriter.
func (c *captureWriter) WriteHeader(code int) {
	if c.status != 0 {
		c.rw.WriteHeader(code) // let net/http report the superfluous call
		return
	}
	// Informational responses are not final: pass them on, remember nothing.
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		c.rw.WriteHeader(code)
		return
	}
	c.status = code
	c.header = c.m.storableHeader(c.rw.Header())
	c.rw.WriteHeader(code)
}

// Write implements http.ResponseWriter.
func (c *captureWriter) Write(p []byte) (int, error) {
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
	}
	if !c.over {
		if c.body.Len()+len(p) > c.limit {
			c.over = true
			c.body = bytes.Buffer{}
		} else {
			c.body.Write(p)
		}
	}
	return c.rw.Write(p)
}

// Flush implements http.Flusher for handlers that assert it directly;
// http.ResponseController finds the underlying writer through Unwrap.
func (c *captureWriter) Flush() {
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
	}
	_ = http.NewResponseController(c.rw).Flush()
}

// Unwrap returns the wrapped writer, for http.ResponseController.
func (c *captureWriter) Unwrap() http.ResponseWriter { return c.rw }

// finalStatus is the status the client got: 200 if the handler wrote nothing.
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
