package idemhttp_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/idem-go/idem/idemhttp"
)

// BenchmarkMiddleware compares, in one run, a bare handler with the same
// handler behind the middleware on the memory store: the first execution
// of a key (claim, run, complete) and the replay of a stored response.
//
//	go test -run=XXX -bench=BenchmarkMiddleware -benchmem ./idemhttp
func BenchmarkMiddleware(b *testing.B) {
	const reqBody = `{"amount":100,"currency":"eur","customer":"cus_123"}`
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/charges/ch_1")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":"ch_1","amount":100,"currency":"eur","status":"succeeded"}`)
	})
	mw, _ := newMiddleware(b, nil)
	wrapped := mw.Handler(handler)
	serve := func(b *testing.B, h http.Handler, key func(i int) string) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(reqBody))
			r.Header.Set("Content-Type", "application/json")
			r.Header.Set("X-User", "alice")
			if k := key(i); k != "" {
				r.Header.Set("Idempotency-Key", k)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != http.StatusCreated {
				b.Fatalf("status %d: %s", w.Code, w.Body)
			}
		}
	}
	b.Run("bare", func(b *testing.B) { serve(b, handler, func(int) string { return "" }) })
	b.Run("first", func(b *testing.B) {
		prefix := "first-" + strconv.Itoa(b.N) + "-"
		serve(b, wrapped, func(i int) string { return prefix + strconv.Itoa(i) })
	})
	b.Run("replay", func(b *testing.B) {
		serve(b, wrapped, func(int) string { return "replayed-key" })
	})
	_ = idemhttp.DefaultHeaderName
}
