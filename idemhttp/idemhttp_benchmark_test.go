package idemhttp_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/idemhttp"
)

const reqBody = `{"amount":100,"currency":"eur","customer":"cus_123"}`

// benchHandler is a small JSON API handler: the work the middleware wraps.
var benchHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/charges/ch_1")
	w.WriteHeader(http.StatusCreated)
	_, _ = io.WriteString(w, `{"id":"ch_1","amount":100,"currency":"eur","status":"succeeded"}`)
})

// reportInterleaved reports the mean time of each case over n iterations
// and the first and replay paths' throughput as a share of the bare one.
func reportInterleaved(b *testing.B, n int, tBare, tFirst, tReplay time.Duration) {
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(n) }
	b.ReportMetric(per(tBare), "bare-ns")
	b.ReportMetric(per(tFirst), "first-ns")
	b.ReportMetric(per(tReplay), "replay-ns")
	b.ReportMetric(100*per(tBare)/per(tFirst), "first-%bare")
	b.ReportMetric(100*per(tBare)/per(tReplay), "replay-%bare")
}

// BenchmarkMiddleware compares, in one run, a bare handler with the same
// handler behind the middleware on the memory store: the first execution
// of a key (claim, run, complete) and the replay of a stored response.
//
//	go test -run=XXX -bench=BenchmarkMiddleware -benchmem ./idemhttp
func BenchmarkMiddleware(b *testing.B) {
	handler := benchHandler
	// Separate stores, so the keys piling up in "first" do not slow
	// "replay" through the garbage collector.
	newWrapped := func() http.Handler {
		mw, _ := newMiddleware(b, nil)
		return mw.Handler(handler)
	}
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
		serve(b, newWrapped(), func(i int) string { return prefix + strconv.Itoa(i) })
	})
	b.Run("replay", func(b *testing.B) {
		serve(b, newWrapped(), func(int) string { return "replayed-key" })
	})
}

// BenchmarkMiddlewareInterleaved runs the three cases in turn within each
// iteration and reports each one's mean time, so that a machine whose load
// changes during the run (CI, shared hosts) still gives honest ratios:
// replay-%bare is the replay path's throughput as a share of the bare
// handler's.
//
//	go test -run=XXX -bench=BenchmarkMiddlewareInterleaved ./idemhttp
func BenchmarkMiddlewareInterleaved(b *testing.B) {
	handler := benchHandler
	mwFirst, _ := newMiddleware(b, nil)
	mwReplay, _ := newMiddleware(b, nil)
	first, replay := mwFirst.Handler(handler), mwReplay.Handler(handler)
	once := func(h http.Handler, key string) time.Duration {
		r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(reqBody))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("X-User", "alice")
		if key != "" {
			r.Header.Set(idemhttp.DefaultHeaderName, key)
		}
		w := httptest.NewRecorder()
		start := time.Now()
		h.ServeHTTP(w, r)
		d := time.Since(start)
		if w.Code != http.StatusCreated {
			b.Fatalf("status %d: %s", w.Code, w.Body)
		}
		return d
	}
	var tBare, tFirst, tReplay time.Duration
	n := 0
	for i := 0; b.Loop(); i++ {
		tBare += once(handler, "")
		tFirst += once(first, "k-"+strconv.Itoa(i))
		tReplay += once(replay, "replayed-key")
		n++
	}
	reportInterleaved(b, n, tBare, tFirst, tReplay)
}

// post sends r, reads the whole response and returns how long that took;
// anything but a 201 fails b.
func post(b *testing.B, client *http.Client, r *http.Request) (time.Duration, *http.Response) {
	start := time.Now()
	resp, err := client.Do(r)
	if err != nil {
		b.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	d := time.Since(start)
	if resp.StatusCode != http.StatusCreated {
		b.Fatalf("status %d", resp.StatusCode)
	}
	return d, resp
}

// BenchmarkMiddlewareHTTP is BenchmarkMiddlewareInterleaved over real
// loopback HTTP (keep-alive client, net/http server): the throughput a
// service sees, which is what the "replay ≥ 50% of bare" target is about.
//
//	go test -run=XXX -bench=BenchmarkMiddlewareHTTP ./idemhttp
func BenchmarkMiddlewareHTTP(b *testing.B) {
	handler := benchHandler
	mwFirst, _ := newMiddleware(b, nil)
	mwReplay, _ := newMiddleware(b, nil)
	servers := []*httptest.Server{
		httptest.NewServer(handler), httptest.NewServer(mwFirst.Handler(handler)), httptest.NewServer(mwReplay.Handler(handler)),
	}
	client := &http.Client{}
	defer func() {
		client.CloseIdleConnections()
		for _, s := range servers {
			s.Close()
		}
	}()
	once := func(url, key string) time.Duration {
		r, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(reqBody))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("X-User", "alice")
		if key != "" {
			r.Header.Set(idemhttp.DefaultHeaderName, key)
		}
		d, _ := post(b, client, r)
		return d
	}
	var tBare, tFirst, tReplay time.Duration
	n := 0
	for i := 0; b.Loop(); i++ {
		tBare += once(servers[0].URL, "")
		tFirst += once(servers[1].URL, "k-"+strconv.Itoa(i))
		tReplay += once(servers[2].URL, "replayed-key")
		n++
	}
	reportInterleaved(b, n, tBare, tFirst, tReplay)
}

// BenchmarkReplayCache compares, alternating request by request, the bare
// handler with the replay of a stored response from the replay cache (the
// request the bench group "HTTP: Idempotency-Key middleware" sends: a
// quoted key, a JSON body). "inproc" calls the handlers directly with a
// recorder, so the middleware's own cost shows undiluted; "loopback" goes
// through net/http over loopback, as a service does. replay-%bare is the
// replay's throughput as a share of the bare handler's; replay-allocs and
// bare-allocs are each case's allocations per request.
//
//	go test -run=XXX -bench=BenchmarkReplayCache -count 5 ./idemhttp
func BenchmarkReplayCache(b *testing.B) {
	handler := benchHandler
	mw, _ := newMiddleware(b, &idemhttp.Config{Cache: &idemhttp.ReplayCache{}})
	replay := mw.Handler(handler)
	newReq := func(url, key string) *http.Request {
		r, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(reqBody))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("X-User", "alice")
		if key != "" {
			r.Header.Set(idemhttp.DefaultHeaderName, strconv.Quote(key))
		}
		return r
	}
	// alternate times bare and replayed requests in turn and reports.
	alternate := func(b *testing.B, once func(replay bool) time.Duration) {
		var tBare, tReplay time.Duration
		n := 0
		for b.Loop() {
			tBare += once(false)
			tReplay += once(true)
			n++
		}
		per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(n) }
		b.ReportMetric(per(tBare), "bare-ns")
		b.ReportMetric(per(tReplay), "replay-ns")
		b.ReportMetric(100*per(tBare)/per(tReplay), "replay-%bare")
		b.ReportMetric(testing.AllocsPerRun(200, func() { once(false) }), "bare-allocs")
		b.ReportMetric(testing.AllocsPerRun(200, func() { once(true) }), "replay-allocs")
	}
	b.Run("inproc", func(b *testing.B) {
		once := func(replayed bool) time.Duration {
			h, key := http.Handler(handler), ""
			if replayed {
				h, key = replay, "replayed-key"
			}
			r := newReq("/payments", key)
			r.RemoteAddr, r.RequestURI = "192.0.2.1:1234", "/payments"
			w := httptest.NewRecorder()
			start := time.Now()
			h.ServeHTTP(w, r)
			d := time.Since(start)
			if w.Code != http.StatusCreated || (replayed && w.Header().Get(idemhttp.ReplayedHeader) != "true") {
				b.Fatalf("status %d, replayed %q: %s", w.Code, w.Header().Get(idemhttp.ReplayedHeader), w.Body)
			}
			return d
		}
		replay.ServeHTTP(httptest.NewRecorder(), newReq("/payments", "replayed-key")) // the first execution fills the cache
		alternate(b, once)
	})
	b.Run("loopback", func(b *testing.B) {
		bare, cached := httptest.NewServer(handler), httptest.NewServer(replay)
		client := &http.Client{}
		defer func() {
			client.CloseIdleConnections()
			bare.Close()
			cached.Close()
		}()
		once := func(replayed bool) time.Duration {
			url, key := bare.URL, ""
			if replayed {
				url, key = cached.URL, "replayed-key-http"
			}
			r := newReq(url+"/payments", key)
			d, resp := post(b, client, r)
			if replayed && resp.Header.Get(idemhttp.ReplayedHeader) != "true" {
				b.Fatalf("not replayed: %v", resp.Header)
			}
			return d
		}
		if resp, err := client.Do(newReq(cached.URL+"/payments", "replayed-key-http")); err == nil { // the first execution
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		alternate(b, once)
	})
	// "clients16" is the bench group's shape: 16 keep-alive clients load
	// one server at a time, the two servers in turn, 256 requests a round;
	// each replay client has its own key.
	b.Run("clients16", func(b *testing.B) {
		const clients, perRound = 16, 256
		bare, cached := httptest.NewServer(handler), httptest.NewServer(replay)
		client := &http.Client{Transport: &http.Transport{MaxIdleConns: clients, MaxIdleConnsPerHost: clients}}
		defer func() {
			client.CloseIdleConnections()
			bare.Close()
			cached.Close()
		}()
		round := func(url string, keyed bool) (wall, cpu time.Duration) {
			var wg sync.WaitGroup
			start, cpu0 := time.Now(), cpuTime()
			for c := range clients {
				wg.Go(func() {
					for range perRound / clients {
						key := ""
						if keyed {
							key = "replayed-key-" + strconv.Itoa(c)
						}
						resp, err := client.Do(newReq(url+"/payments", key))
						if err != nil {
							b.Error(err)
							return
						}
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						if resp.StatusCode != http.StatusCreated || (keyed && resp.Header.Get(idemhttp.ReplayedHeader) != "true") {
							b.Errorf("status %d, replayed %q", resp.StatusCode, resp.Header.Get(idemhttp.ReplayedHeader))
						}
					}
				})
			}
			wg.Wait()
			return time.Since(start), cpuTime() - cpu0
		}
		for c := range clients { // the first executions fill the cache
			if resp, err := client.Do(newReq(cached.URL+"/payments", "replayed-key-"+strconv.Itoa(c))); err == nil {
				resp.Body.Close()
			}
		}
		var tBare, tReplay, cBare, cReplay time.Duration
		for b.Loop() {
			w, c := round(bare.URL, false)
			tBare, cBare = tBare+w, cBare+c
			w, c = round(cached.URL, true)
			tReplay, cReplay = tReplay+w, cReplay+c
		}
		b.ReportMetric(100*tBare.Seconds()/tReplay.Seconds(), "replay-%bare")
		if cReplay > 0 {
			// The same ratio in CPU time (client and server are both in this
			// process): how the two compare on a CPU-bound machine.
			b.ReportMetric(100*cBare.Seconds()/cReplay.Seconds(), "replay-cpu-%bare")
			n := float64(b.N * perRound)
			b.ReportMetric(float64(cBare.Nanoseconds())/n, "bare-cpu-ns/req")
			b.ReportMetric(float64(cReplay.Nanoseconds())/n, "replay-cpu-ns/req")
		}
	})
}
