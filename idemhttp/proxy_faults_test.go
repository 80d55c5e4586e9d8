package idemhttp_test

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemtest/faultnet"
)

// startProxy serves NewProxy to upstream, with a middleware built by
// newMiddleware(cfg) (principal from X-User unless cfg says otherwise) and
// the proxy handler wrapped by wrap if it is not nil.
func startProxy(t *testing.T, upstream string, cfg *idemhttp.Config, pcfg *idemhttp.ProxyConfig,
	wrap func(http.Handler) http.Handler) (*httptest.Server, *countingStore) {
	t.Helper()
	mw, st := newMiddleware(t, cfg)
	if pcfg == nil {
		pcfg = &idemhttp.ProxyConfig{}
	}
	if pcfg.Logger == nil {
		pcfg.Logger = slog.New(slog.DiscardHandler)
	}
	u, err := url.Parse(upstream)
	if err != nil {
		t.Fatal(err)
	}
	h, err := idemhttp.NewProxy(u, mw, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	if wrap != nil {
		h = wrap(h)
	}
	return startServer(t, h), st
}

// executions counts the requests an upstream executed, per key.
type executions struct {
	mu sync.Mutex
	n  map[string]int
	ch chan string // every execution's key, for tests that wait for one
}

func newExecutions() *executions {
	return &executions{n: map[string]int{}, ch: make(chan string, 1000)}
}

func (e *executions) add(key string) int {
	e.mu.Lock()
	e.n[key]++
	n := e.n[key]
	e.mu.Unlock()
	e.ch <- key
	return n
}

func (e *executions) of(key string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n[key]
}

// 1 and 2 through the proxy: a client that is cut after its request
// reached the upstream, or that times out, neither cancels nor repeats the
// upstream call; it is recorded and replayed.
func TestProxyFaultClientLeaves(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"cut", "timeout"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			execs := newExecutions()
			release := make(chan struct{})
			ctxErr := make(chan error, 1)
			started := make(chan struct{}, 1)
			up := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				n := execs.add(r.Header.Get("Idempotency-Key"))
				started <- struct{}{}
				hold(t, release)
				ctxErr <- r.Context().Err()
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("X-Request-Id", "up-1")
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, `{"order":%d}`, n)
			}))
			log := newEventLog()
			gone := make(chan struct{})
			proxy, _ := startProxy(t, up.URL, &idemhttp.Config{Hooks: []idem.Hook{log}}, nil,
				func(h http.Handler) http.Handler { return watchClient(h, "first", gone) })
			first := newRequest(t, http.MethodPost, proxy.URL+"/orders", "p1", body1, reqID("first"))
			if how == "cut" {
				cutAfterStart(t, proxy.Listener.Addr().String(), first, started)
			} else {
				c := newClient(t)
				c.Timeout = 200 * time.Millisecond
				if a, err := exchange(c, first); err == nil {
					t.Fatalf("the client did not time out: %v", a)
				}
				recv(t, started, "the upstream to get the request")
			}
			recv(t, gone, "the proxy to see its client go")
			wantInFlight(t, send(t, newClient(t), http.MethodPost, proxy.URL+"/orders", "p1", body1))

			close(release)
			if err := recv(t, ctxErr, "the upstream to answer"); err != nil {
				t.Fatalf("the upstream's request was cancelled when the proxy's client left: %v", err)
			}
			if ev := log.await(t, "first"); ev.Outcome != idem.Processed || ev.Status != http.StatusCreated || !ev.ClientGone {
				t.Fatalf("event %+v, want executed 201 with ClientGone", ev)
			}
			a := send(t, newClient(t), http.MethodPost, proxy.URL+"/orders", "p1", body1)
			wantReplay(t, a, answer{status: http.StatusCreated, body: `{"order":1}`})
			if a.header.Get("X-Request-Id") != "up-1" {
				t.Errorf("replay without the upstream's X-Request-Id: %v", a)
			}
			if n := execs.of("p1"); n != 1 {
				t.Fatalf("upstream executions %d, want 1", n)
			}
		})
	}
}

// 3 through the proxy: an SSE upstream whose client reads the first events
// and leaves; the proxy copies the stream to the end, the retry replays it.
func TestProxyFaultEventStreamClientLeaves(t *testing.T) {
	t.Parallel()
	var execs atomic.Int64
	failures := make(chan error, 20)
	gone := make(chan struct{})
	up := startServer(t, eventStream(t, &execs, gone, failures))
	log := newEventLog()
	proxy, _ := startProxy(t, up.URL, &idemhttp.Config{Hooks: []idem.Hook{log}}, nil,
		func(h http.Handler) http.Handler { return watchClient(h, "first", gone) })

	resp, err := newClient(t).Do(newRequest(t, http.MethodPost, proxy.URL+"/events", "p3", body1, reqID("first")))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if got := readEvents(t, bufio.NewReader(resp.Body), 2); got != allEvents(2) {
		t.Fatalf("first events %q", got)
	}
	resp.Body.Close()

	if err := recv(t, failures, "the upstream to finish"); err != nil {
		t.Fatalf("upstream: %v", err)
	}
	if ev := log.await(t, "first"); ev.Outcome != idem.Processed || ev.Status != http.StatusCreated {
		t.Fatalf("event %+v", ev)
	}
	wantReplay(t, send(t, newClient(t), http.MethodPost, proxy.URL+"/events", "p3", body1), answer{status: http.StatusCreated, body: allEvents(6)})
	if n := execs.Load(); n != 1 {
		t.Fatalf("upstream executions %d, want 1", n)
	}
}

// 11. A client's Connection header cannot strip the scope header
// (PreserveHeaders) or the key from what the upstream receives; other
// headers it names are stripped.
func TestProxyFaultConnectionHeader(t *testing.T) {
	t.Parallel()
	seen := make(chan http.Header, 4)
	up := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Clone()
		w.WriteHeader(http.StatusCreated)
	}))
	cfg := func() *idemhttp.Config {
		return &idemhttp.Config{Principal: idemhttp.PrincipalFromHeader("X-Client-Id")}
	}
	preserving, _ := startProxy(t, up.URL, cfg(), &idemhttp.ProxyConfig{PreserveHeaders: []string{"x-client-id"}}, nil)
	plain, _ := startProxy(t, up.URL, cfg(), nil, nil)
	hop := func(r *http.Request) {
		r.Header.Set("X-Client-Id", "alice")
		r.Header.Set("X-Other", "hop")
		r.Header.Set("Connection", "X-Client-Id, X-Other, Idempotency-Key")
	}
	if a := send(t, newClient(t), http.MethodPost, preserving.URL+"/orders", "c1", body1, hop); a.status != http.StatusCreated {
		t.Fatalf("%v", a)
	}
	h := recv(t, seen, "the upstream request")
	if h.Get("X-Client-Id") != "alice" || h.Get("Idempotency-Key") != "c1" || h.Get("X-Other") != "" {
		t.Fatalf("upstream got X-Client-Id %q, Idempotency-Key %q, X-Other %q; want alice, c1 and none",
			h.Get("X-Client-Id"), h.Get("Idempotency-Key"), h.Get("X-Other"))
	}
	// Without PreserveHeaders, the Connection header strips the scope
	// header, but never the key.
	if a := send(t, newClient(t), http.MethodPost, plain.URL+"/orders", "c1", body1, hop); a.status != http.StatusCreated {
		t.Fatalf("%v", a)
	}
	h = recv(t, seen, "the upstream request")
	if h.Get("X-Client-Id") != "" || h.Get("Idempotency-Key") != "c1" || h.Get("X-Other") != "" {
		t.Fatalf("upstream got X-Client-Id %q, Idempotency-Key %q, X-Other %q", h.Get("X-Client-Id"), h.Get("Idempotency-Key"), h.Get("X-Other"))
	}
}

// tcpUpstream serves handle on every connection to a new loopback
// listener and returns its address; the listener and every connection are
// closed, and the handlers waited for, when the test ends.
func tcpUpstream(t *testing.T, handle func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				handle(c)
			})
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// 12. An upstream that reads a request on a reused keep-alive connection
// and closes it without answering may have executed it: the proxy's
// transport must not re-send it (net/http does so by itself for requests
// with an Idempotency-Key); the client gets a recorded 502
// outcome-unknown, and so do its retries.
func TestProxyFaultNoTransportResend(t *testing.T) {
	t.Parallel()
	execs := newExecutions()
	var (
		mu     sync.Mutex
		second = map[string]bool{} // keys that came as a connection's second request
	)
	addr := tcpUpstream(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for n := 1; ; n++ {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, req.Body)
			key := req.Header.Get("Idempotency-Key")
			execs.add(key)
			if n == 2 {
				mu.Lock()
				second[key] = true
				mu.Unlock()
				return // read, executed, never answered
			}
			body := fmt.Sprintf(`{"key":%q}`, key)
			fmt.Fprintf(c, "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		}
	})
	proxy, _ := startProxy(t, "http://"+addr, nil, nil, nil)
	c := newClient(t)
	for attempt := range 10 {
		keyA, keyB := fmt.Sprintf("a%d", attempt), fmt.Sprintf("b%d", attempt)
		if a := send(t, c, http.MethodPost, proxy.URL+"/orders", keyA, body1); a.status != http.StatusCreated {
			t.Fatalf("first request: %v", a)
		}
		b := send(t, c, http.MethodPost, proxy.URL+"/orders", keyB, body1)
		mu.Lock()
		reused := second[keyB]
		mu.Unlock()
		if !reused {
			// The proxy's transport had not put the first connection back
			// in its pool yet and dialed a new one; try again.
			continue
		}
		if n := execs.of(keyB); n != 1 {
			t.Fatalf("the upstream executed %q %d times: the transport re-sent it after the connection broke", keyB, n)
		}
		wantProblemAnswer(t, b, http.StatusBadGateway, idemhttp.TypeOutcomeUnknown)
		for range 2 {
			r := send(t, c, http.MethodPost, proxy.URL+"/orders", keyB, body1)
			wantReplay(t, r, b)
		}
		if n := execs.of(keyB); n != 1 {
			t.Fatalf("upstream executions of %q: %d, want 1", keyB, n)
		}
		return
	}
	t.Fatal("the proxy never sent a second request on a kept-alive connection")
}

// answerer is an upstream that answers every request with a 201 naming its
// execution, after waiting for delay.
func answerer(t *testing.T, execs *executions, delay time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		n := execs.add(r.Header.Get("Idempotency-Key"))
		if delay > 0 {
			select {
			case <-time.After(delay):
			case <-t.Context().Done():
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%d}`, n)
	})
}

// 13. Upstream failures: what was never forwarded is released; what was
// forwarded and not answered is in doubt, recorded once and replayed.
func TestProxyFaultUpstream(t *testing.T) {
	t.Parallel()
	t.Run("refused", func(t *testing.T) {
		t.Parallel()
		// A port nobody listens on: the dial is refused, nothing is sent.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		execs := newExecutions()
		proxy, _ := startProxy(t, "http://"+addr, nil, nil, nil)
		c := newClient(t)
		wantProblemAnswer(t, send(t, c, http.MethodPost, proxy.URL+"/orders", "r0", body1), http.StatusBadGateway, idemhttp.TypeUpstreamUnreachable)
		// The upstream comes up on that port: the retry is forwarded.
		ln, err = net.Listen("tcp", addr)
		if err != nil {
			t.Skipf("the port was taken meanwhile: %v", err)
		}
		up := httptest.NewUnstartedServer(answerer(t, execs, 0))
		up.Listener.Close()
		up.Listener = ln
		up.Start()
		t.Cleanup(up.Close)
		a := send(t, c, http.MethodPost, proxy.URL+"/orders", "r0", body1)
		if a.status != http.StatusCreated || a.header.Get(idemhttp.ReplayedHeader) != "" || execs.of("r0") != 1 {
			t.Fatalf("retry after 502: %v, upstream executions %d; want it forwarded", a, execs.of("r0"))
		}
	})
	t.Run("reset on accept", func(t *testing.T) {
		t.Parallel()
		// The relay accepts the connection and resets it at once. Most of
		// the time the proxy's transport sees the reset before it writes
		// the request: unreachable, released. Sometimes its write lands
		// first, and then the request may have been read: in doubt,
		// recorded, which is just as right. Each attempt must be one or
		// the other, consistently; the first must turn up within a few.
		execs := newExecutions()
		up := startServer(t, answerer(t, execs, 0))
		relay := startRelay(t, up.Listener.Addr().String())
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.DisableKeepAlives = true // every attempt dials, so SetNext picks it
		t.Cleanup(tr.CloseIdleConnections)
		proxy, _ := startProxy(t, relay.URL(), nil, &idemhttp.ProxyConfig{Transport: tr}, nil)
		c := newClient(t)
		for attempt := range 20 {
			key := fmt.Sprintf("r%d", attempt)
			relay.SetNext(1, faultnet.Fault{Refuse: true})
			first := send(t, c, http.MethodPost, proxy.URL+"/orders", key, body1)
			if first.status != http.StatusBadGateway {
				t.Fatalf("refused: %v", first)
			}
			retry := send(t, c, http.MethodPost, proxy.URL+"/orders", key, body1)
			if problemOf(t, first).Type == idemhttp.TypeOutcomeUnknown {
				wantReplay(t, retry, first)
				if n := execs.of(key); n != 0 {
					t.Fatalf("upstream executions %d of a refused request", n)
				}
				t.Logf("attempt %d: the request was written before the reset: in doubt", attempt)
				continue
			}
			wantProblemAnswer(t, first, http.StatusBadGateway, idemhttp.TypeUpstreamUnreachable)
			if retry.status != http.StatusCreated || retry.header.Get(idemhttp.ReplayedHeader) != "" || execs.of(key) != 1 {
				t.Fatalf("retry after 502: %v, upstream executions %d; want it forwarded", retry, execs.of(key))
			}
			return
		}
		t.Fatal("every refused request was in doubt")
	})
	t.Run("hang", func(t *testing.T) {
		t.Parallel()
		execs := newExecutions()
		up := startServer(t, answerer(t, execs, 0))
		relay := startRelay(t, up.Listener.Addr().String())
		relay.Set(faultnet.Fault{Hang: true})
		proxy, _ := startProxy(t, relay.URL(), nil, &idemhttp.ProxyConfig{Timeout: 300 * time.Millisecond}, nil)
		c := newClient(t)
		first := send(t, c, http.MethodPost, proxy.URL+"/orders", "h1", body1)
		wantProblemAnswer(t, first, http.StatusGatewayTimeout, idemhttp.TypeOutcomeUnknown)
		recv(t, execs.ch, "the upstream to execute")
		relay.Set(faultnet.Fault{}) // even with the upstream answering again
		for range 3 {
			wantReplay(t, send(t, c, http.MethodPost, proxy.URL+"/orders", "h1", body1), first)
		}
		if n := execs.of("h1"); n != 1 {
			t.Fatalf("upstream executions %d, want 1", n)
		}
	})
	t.Run("5xx then success", func(t *testing.T) {
		t.Parallel()
		var calls atomic.Int64
		up := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if calls.Add(1) == 1 {
				http.Error(w, "busy", http.StatusServiceUnavailable)
				return
			}
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "created")
		}))
		proxy, _ := startProxy(t, up.URL, nil, nil, nil)
		c := newClient(t)
		if a := send(t, c, http.MethodPost, proxy.URL+"/orders", "s1", body1); a.status != http.StatusServiceUnavailable {
			t.Fatalf("first: %v", a)
		}
		ok := send(t, c, http.MethodPost, proxy.URL+"/orders", "s1", body1)
		if ok.status != http.StatusCreated || ok.header.Get(idemhttp.ReplayedHeader) != "" {
			t.Fatalf("retry after 5xx: %v, want it forwarded", ok)
		}
		wantReplay(t, send(t, c, http.MethodPost, proxy.URL+"/orders", "s1", body1), ok)
		if n := calls.Load(); n != 2 {
			t.Fatalf("upstream executions %d, want 2 (a 5xx releases the key)", n)
		}
	})
	t.Run("cut mid-body", func(t *testing.T) {
		t.Parallel()
		execs := newExecutions()
		big := strings.Repeat("x", 64<<10)
		up := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			execs.add(r.Header.Get("Idempotency-Key"))
			w.Header().Set("Content-Length", fmt.Sprint(len(big)))
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, big)
		}))
		relay := startRelay(t, up.Listener.Addr().String())
		relay.Set(faultnet.Fault{CutAfterResponse: 4096})
		proxy, _ := startProxy(t, relay.URL(), nil, nil, nil)
		c := newClient(t)
		first := send(t, c, http.MethodPost, proxy.URL+"/orders", "m1", body1)
		wantProblemAnswer(t, first, http.StatusBadGateway, idemhttp.TypeOutcomeUnknown)
		relay.Set(faultnet.Fault{})
		for range 2 {
			wantReplay(t, send(t, c, http.MethodPost, proxy.URL+"/orders", "m1", body1), first)
		}
		if n := execs.of("m1"); n != 1 {
			t.Fatalf("upstream executions %d, want 1", n)
		}
	})
	for _, inDoubt := range []idemhttp.InDoubt{idemhttp.InDoubtRecord, idemhttp.InDoubtRelease} {
		t.Run("stream cut "+string(inDoubt), func(t *testing.T) {
			t.Parallel()
			var execs atomic.Int64
			more := make(chan struct{})
			up := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				n := execs.Add(1)
				w.Header().Set("Content-Type", "text/event-stream")
				w.WriteHeader(http.StatusCreated)
				rc := http.NewResponseController(w)
				fmt.Fprintf(w, "data: run %d\n\n", n)
				_ = rc.Flush()
				if n == 1 {
					hold(t, more)
				}
				for i := 2; i <= 4; i++ {
					fmt.Fprintf(w, "data: %d\n\n", i)
					_ = rc.Flush()
				}
			}))
			relay := startRelay(t, up.Listener.Addr().String())
			log := newEventLog()
			proxy, _ := startProxy(t, relay.URL(), &idemhttp.Config{Hooks: []idem.Hook{log}}, &idemhttp.ProxyConfig{InDoubt: inDoubt}, nil)
			c := newClient(t)
			resp, err := c.Do(newRequest(t, http.MethodPost, proxy.URL+"/events", "e1", body1, reqID("first")))
			if err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(resp.Body)
			if got := readEvents(t, br, 1); got != "data: run 1\n\n" {
				t.Fatalf("first event %q", got)
			}
			relay.Set(faultnet.Fault{CutAfterResponse: 1}) // the upstream's connection dies mid-stream
			close(more)
			rest, err := io.ReadAll(br)
			resp.Body.Close()
			if err == nil {
				t.Fatalf("the client's stream ended cleanly after %q; want it broken off", rest)
			}
			ev := log.await(t, "first")
			if ev.Outcome != idem.InDoubt {
				t.Fatalf("event %+v, want in_doubt", ev)
			}
			relay.Set(faultnet.Fault{})
			retry := send(t, c, http.MethodPost, proxy.URL+"/events", "e1", body1)
			if inDoubt == idemhttp.InDoubtRecord {
				wantProblemAnswer(t, retry, http.StatusBadGateway, idemhttp.TypeOutcomeUnknown)
				if retry.header.Get(idemhttp.ReplayedHeader) != "true" || execs.Load() != 1 {
					t.Fatalf("retry %v, upstream executions %d; want the recorded outcome-unknown and 1", retry, execs.Load())
				}
				return
			}
			// InDoubtRelease: the key was released, the retry is forwarded.
			if retry.status != http.StatusCreated || !strings.HasPrefix(retry.body, "data: run 2\n\n") || execs.Load() != 2 {
				t.Fatalf("retry %v, upstream executions %d; want it forwarded again", retry, execs.Load())
			}
		})
	}
}

// echoUpgrade answers a POST with 101 Switching Protocols to "echo" and
// then echoes the connection's bytes back until the client closes it.
func echoUpgrade(t *testing.T, execs *atomic.Int64) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		execs.Add(1)
		if r.Header.Get("Upgrade") != "echo" {
			http.Error(w, "upgrade required", http.StatusUpgradeRequired)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
			return
		}
		defer conn.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		if brw.Flush() != nil {
			return
		}
		_, _ = io.Copy(conn, brw.Reader)
	}
}

// 14. A POST answered with 101 Switching Protocols is relayed over the
// hijacked connection once; it cannot be replayed, so a retry gets 410
// response-not-recordable and nothing runs again.
func TestProxyFaultUpgrade(t *testing.T) {
	t.Parallel()
	run := func(t *testing.T, target string, execs *atomic.Int64, log *eventLog) {
		c := newClient(t)
		c.Timeout = 0 // a client timeout wraps the body, which then cannot be written to
		req := newRequest(t, http.MethodPost, target+"/tunnel", "u1", body1, reqID("first"))
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "echo")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusSwitchingProtocols {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("status %d %s", resp.StatusCode, b)
		}
		tunnel := resp.Body.(io.ReadWriteCloser)
		br := bufio.NewReader(tunnel)
		for _, msg := range []string{"ping\n", "pong\n"} {
			if _, err := io.WriteString(tunnel, msg); err != nil {
				t.Fatal(err)
			}
			if got, err := br.ReadString('\n'); got != msg || err != nil {
				t.Fatalf("echo %q, %v", got, err)
			}
		}
		// While the tunnel is open the key is in flight.
		wantInFlight(t, send(t, newClient(t), http.MethodPost, target+"/tunnel", "u1", body1, reqID("during")))
		tunnel.Close()
		if ev := log.await(t, "first"); ev.Outcome != idem.Tombstoned || ev.Status != http.StatusSwitchingProtocols {
			t.Fatalf("event %+v", ev)
		}
		for range 2 {
			a := send(t, newClient(t), http.MethodPost, target+"/tunnel", "u1", body1)
			wantProblemAnswer(t, a, http.StatusGone, idemhttp.TypeResponseNotRecordable)
			if a.header.Get("Idempotency-Key") != "u1" {
				t.Errorf("410 does not echo the key: %v", a)
			}
		}
		if n := execs.Load(); n != 1 {
			t.Fatalf("executions %d, want 1", n)
		}
	}
	t.Run("proxy", func(t *testing.T) {
		t.Parallel()
		var execs atomic.Int64
		up := startServer(t, echoUpgrade(t, &execs))
		log := newEventLog()
		proxy, _ := startProxy(t, up.URL, &idemhttp.Config{Hooks: []idem.Hook{log}}, nil, nil)
		run(t, proxy.URL, &execs, log)
	})
	t.Run("handler", func(t *testing.T) {
		t.Parallel()
		var execs atomic.Int64
		log := newEventLog()
		mw, _ := newMiddleware(t, &idemhttp.Config{Hooks: []idem.Hook{log}})
		srv := startServer(t, mw.Handler(echoUpgrade(t, &execs)))
		run(t, srv.URL, &execs, log)
	})
}

// 17. BodyReadTimeout cuts a client that trickles its body (408, nothing
// forwarded) and never an upstream that is slower than it.
func TestProxyFaultBodyReadTimeout(t *testing.T) {
	t.Parallel()
	execs := newExecutions()
	up := startServer(t, answerer(t, execs, 1500*time.Millisecond))
	proxy, st := startProxy(t, up.URL, nil, &idemhttp.ProxyConfig{BodyReadTimeout: 500 * time.Millisecond}, nil)

	t.Run("trickling client", func(t *testing.T) {
		conn, err := net.Dial("tcp", proxy.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(patience))
		body := `{"amount":100,"x":1}`
		fmt.Fprintf(conn, "POST /orders HTTP/1.1\r\nHost: x\r\nX-User: alice\r\nIdempotency-Key: slow\r\n"+
			"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body))
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			for i := range len(body) {
				select {
				case <-stop:
					return
				case <-time.After(200 * time.Millisecond):
				}
				if _, err := conn.Write([]byte{body[i]}); err != nil {
					return
				}
			}
		})
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		close(stop)
		wg.Wait()
		if err != nil {
			t.Fatalf("reading the response: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		wantProblemAnswer(t, answer{resp.StatusCode, resp.Header, string(b)}, http.StatusRequestTimeout, idemhttp.TypeBodyTimeout)
		if n := execs.of("slow"); n != 0 || st.claims.Load() != 0 {
			t.Fatalf("upstream executions %d, claims %d: a body that never arrived was forwarded", n, st.claims.Load())
		}
	})
	t.Run("slow upstream", func(t *testing.T) {
		// Keyed, and a pass-through without a key (which runs on the
		// client's context).
		for _, key := range []string{"fast-body", ""} {
			if a := send(t, newClient(t), http.MethodPost, proxy.URL+"/orders", key, body1); a.status != http.StatusCreated {
				t.Fatalf("key %q: %v; a slow upstream was cut by the body's read deadline", key, a)
			}
		}
	})
}

// 21. Fifty clients send one key through the proxy while the relay in
// front of it cuts connections at random; each retries until it gets an
// answer other than 409. The upstream runs once and every final answer is
// the same.
func TestProxyFaultConcurrentRetriesUnderCuts(t *testing.T) {
	t.Parallel()
	execs := newExecutions()
	up := startServer(t, answerer(t, execs, 100*time.Millisecond))
	proxy, _ := startProxy(t, up.URL, nil, nil, nil)
	relay := startRelay(t, proxy.Listener.Addr().String())
	rng := rand.New(rand.NewPCG(1, 2))
	for range 150 {
		var f faultnet.Fault // none: the connection passes
		switch p := rng.IntN(100); {
		case p < 45: // the client vanishes once its request is in; the proxy sees it
			f = faultnet.Fault{CutAfterRequest: 1, CutTarget: true}
		case p < 55: // the client is cut; the proxy answers into the void
			f = faultnet.Fault{CutAfterRequest: 1}
		case p < 75: // the answer breaks off
			f = faultnet.Fault{CutAfterResponse: 1 + rng.Int64N(300), CutTarget: rng.IntN(2) == 0}
		case p < 85:
			f = faultnet.Fault{ResponseDelay: time.Duration(rng.IntN(20)) * time.Millisecond}
		}
		relay.SetNext(1, f)
	}

	const clients = 50
	finals := make([]answer, clients)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range clients {
		wg.Go(func() {
			<-start
			c := newClient(t)
			deadline := time.Now().Add(patience)
			for time.Now().Before(deadline) {
				a, err := exchange(c, newRequest(t, http.MethodPost, relay.URL()+"/orders", "storm", body1))
				switch {
				case err != nil:
					time.Sleep(5 * time.Millisecond)
				case a.status == http.StatusConflict:
					time.Sleep(20 * time.Millisecond)
				default:
					finals[i] = a
					return
				}
			}
			t.Errorf("client %d: no final answer within %v", i, patience)
		})
	}
	close(start)
	wg.Wait()
	if t.Failed() {
		return
	}
	if n := execs.of("storm"); n != 1 {
		t.Fatalf("upstream executions %d, want 1", n)
	}
	for i, a := range finals {
		if a.status != http.StatusCreated || a.body != `{"order":1}` {
			t.Fatalf("client %d's final answer %v, want 201 {\"order\":1}", i, a)
		}
	}
	s := relay.Stats()
	t.Logf("relay: %d connections, %d cut", s.Accepted, s.Cut)
}
