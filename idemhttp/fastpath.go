package idemhttp

import (
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"net/http"
	"strconv"
	"sync"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/sfv"
)

// This file holds the allocation-free forms of the steps every covered
// request takes (key parsing, scope, fingerprint) and the replay's
// precomputed header lines. Each gives exactly what the general form
// gives; the tests compare them on the same inputs.

// plainQuoted returns the content of v when v is an sf-string without
// escapes and with nothing around it, the form clients send: what
// sfv.ParseStringItem returns for it, without a copy.
func plainQuoted(v string) (string, bool) {
	if len(v) < 2 || len(v) > sfv.MaxLen || v[0] != '"' || v[len(v)-1] != '"' {
		return "", false
	}
	s := v[1 : len(v)-1]
	if !plainPrintable(s) {
		return "", false
	}
	return s, true
}

// plainPrintable reports whether s is printable ASCII without '"' or '\':
// the strings strconv.Quote only surrounds with quotes.
func plainPrintable(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

// quoted is strconv.Quote(s), in the common case without its allocation.
func quoted(s string) string {
	if plainPrintable(s) {
		return `"` + s + `"`
	}
	return strconv.Quote(s)
}

// fpWriter computes idem.FingerprintParts of a sequence of parts without
// building the parts: small parts are framed into one pooled buffer that
// is hashed at the end in one call; a large part (a big body) switches to
// a streaming hash, so it is never copied.
type fpWriter struct {
	b []byte
	h hash.Hash // nil until a large part arrives
}

const (
	fpBigPart   = 16 << 10 // parts larger than this are hashed in place
	fpPooledCap = 64 << 10 // larger buffers are not kept
)

var fpPool = sync.Pool{New: func() any { return &fpWriter{b: make([]byte, 0, 512)} }}

func newFPWriter() *fpWriter {
	w := fpPool.Get().(*fpWriter)
	w.b, w.h = w.b[:0], nil
	return w
}

func (w *fpWriter) length(n int) { w.b = binary.BigEndian.AppendUint64(w.b, uint64(n)) }

func (w *fpWriter) str(p string) {
	w.length(len(p))
	w.b = append(w.b, p...)
}

func (w *fpWriter) bytes(p []byte) {
	w.length(len(p))
	if len(p) <= fpBigPart {
		w.b = append(w.b, p...)
		return
	}
	if w.h == nil {
		w.h = sha256.New()
	}
	w.h.Write(w.b)
	w.h.Write(p)
	w.b = w.b[:0]
}

// header adds strings.Join(vs, "\n") as one part.
func (w *fpWriter) header(vs []string) {
	n := 0
	for i, v := range vs {
		if i > 0 {
			n++
		}
		n += len(v)
	}
	w.length(n)
	for i, v := range vs {
		if i > 0 {
			w.b = append(w.b, '\n')
		}
		w.b = append(w.b, v...)
	}
}

// sum returns the fingerprint and gives w back to the pool.
func (w *fpWriter) sum() idem.Fingerprint {
	var f idem.Fingerprint
	if w.h == nil {
		f = sha256.Sum256(w.b)
	} else {
		w.h.Write(w.b)
		copy(f[:], w.h.Sum(nil))
		w.h = nil
	}
	if cap(w.b) <= fpPooledCap {
		fpPool.Put(w)
	}
	return f
}

// replayLines is a stored response's header as the replay writes it,
// computed once when the response is cached: the stored lines, then
// Idempotent-Replayed and Content-Length.
type replayLines struct {
	keys []string // the stored header names
	ends []int    // ends[i]: where keys[i]'s values end in vals
	vals []string // the stored values, then "true" and the body's length
}

func newReplayLines(sr *storedResponse) *replayLines {
	l := &replayLines{}
	for k, vs := range sr.header {
		l.keys = append(l.keys, k)
		l.vals = append(l.vals, vs...)
		l.ends = append(l.ends, len(l.vals))
	}
	l.vals = append(l.vals, "true", strconv.Itoa(len(sr.body)))
	return l
}

// set writes the lines into h, replacing what h holds under their names,
// and echo under name when echo is not empty. The values are one fresh
// copy, so nothing that writes to h afterwards can reach the cached
// response.
func (l *replayLines) set(h http.Header, name, echo string) {
	vals := make([]string, len(l.vals), len(l.vals)+1)
	copy(vals, l.vals)
	if echo != "" {
		vals = append(vals, echo)
		h[name] = vals[len(vals)-1:]
		vals = vals[:len(l.vals)]
	}
	start := 0
	for i, k := range l.keys {
		end := l.ends[i]
		h[k] = vals[start:end:end]
		start = end
	}
	n := len(vals)
	h[ReplayedHeader] = vals[n-2 : n-1 : n-1]
	h["Content-Length"] = vals[n-1 : n : n]
}
