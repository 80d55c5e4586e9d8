package faultnet_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem/idemtest/faultnet"
)

// handled is an HTTP server that numbers the requests it handles and
// answers "done N".
type handled struct {
	srv  *httptest.Server
	n    atomic.Int64
	each chan struct{} // a value per request handled
}

func newHandled(t *testing.T) *handled {
	h := &handled{each: make(chan struct{}, 100)}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		n := h.n.Add(1)
		h.each <- struct{}{}
		fmt.Fprintf(w, "done %d", n)
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *handled) addr() string { return h.srv.Listener.Addr().String() }

// await waits until the server has handled n more requests.
func (h *handled) await(t *testing.T, n int) {
	t.Helper()
	for range n {
		recv(t, h.each, "the server to handle a request")
	}
}

func TestStartRejectsBadTarget(t *testing.T) {
	if _, err := faultnet.Start("no-port"); err == nil {
		t.Fatal("Start accepted a target without a port")
	}
}

// Pass relays both directions byte for byte, passes a half-close on, and
// counts what it moved.
func TestPass(t *testing.T) {
	r := start(t, tcpServer(t, echo))
	c := dial(t, r.Addr())
	msg := bytes.Repeat([]byte("0123456789abcdef"), 10_000) // several 32 KiB chunks
	go func() {
		_, _ = c.Write(msg)
		_ = c.CloseWrite()
	}()
	got, err := io.ReadAll(c) // ends only if the echo's half-close came back
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("echoed %d bytes, want the %d sent", len(got), len(msg))
	}
	s := wait(t, r, "the connection to end", func(s faultnet.Stats) bool { return s.Active == 0 })
	want := faultnet.Stats{Accepted: 1, ToTarget: int64(len(msg)), ToClient: int64(len(msg))}
	if s != want {
		t.Fatalf("stats %+v, want %+v", s, want)
	}
	if r.URL() != "http://"+r.Addr() {
		t.Fatalf("URL %q, Addr %q", r.URL(), r.Addr())
	}
}

func TestPassHTTP(t *testing.T) {
	h := newHandled(t)
	r := start(t, h.addr())
	body, err := post(client(t), r.URL())
	if err != nil || body != "done 1" {
		t.Fatalf("got %q, %v", body, err)
	}
}

// Refuse resets a new connection at once, without dialing the target: the
// client fails instead of waiting, and the server never sees a request.
func TestRefuse(t *testing.T) {
	h := newHandled(t)
	r := start(t, h.addr())
	r.Set(faultnet.Fault{Refuse: true})

	// The kernel completes the handshake before the relay resets the
	// connection, so the reset meets either the dial or the first read.
	c, err := net.Dial("tcp", r.Addr())
	if err == nil {
		_ = c.SetDeadline(time.Now().Add(patience))
		_, err = c.Read(make([]byte, 1))
		_ = c.Close()
	}
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("a refused connection: %v, want a reset", err)
	}
	if _, err := post(client(t), r.URL()); err == nil {
		t.Fatal("a request through a refusing relay succeeded")
	}
	s := wait(t, r, "the refusals", func(s faultnet.Stats) bool { return s.Refused == 2 })
	if s.Accepted != 2 || s.Active != 0 || s.ToTarget != 0 {
		t.Fatalf("stats %+v", s)
	}

	r.Set(faultnet.Fault{}) // refusing applies to new connections only
	if body, err := post(client(t), r.URL()); err != nil || body != "done 1" {
		t.Fatalf("after Set(Fault{}): %q, %v; want the first request the server saw", body, err)
	}
}

// A target nobody listens on resets the client the same way.
func TestTargetDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := ln.Addr().String()
	_ = ln.Close()

	r := start(t, down)
	if _, err := post(client(t), r.URL()); err == nil {
		t.Fatal("a request to a closed port succeeded")
	}
	wait(t, r, "the dial failure", func(s faultnet.Stats) bool { return s.DialFailed == 1 && s.Active == 0 })
}

// CutAfterRequest drops the client once its request reached the server:
// the client's request fails while the handler is still running, and the
// server finishes it undisturbed (its context is not canceled) and sends a
// response the relay drops.
func TestCutAfterRequest(t *testing.T) {
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	finished := make(chan error, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		_, _ = io.Copy(io.Discard, req.Body)
		started <- struct{}{}
		select {
		case <-release:
		case <-t.Context().Done():
		}
		finished <- req.Context().Err()
		fmt.Fprint(w, "charged")
	}))
	t.Cleanup(srv.Close)
	r := start(t, srv.Listener.Addr().String())
	r.Set(faultnet.Fault{CutAfterRequest: 1})

	_, err := post(client(t), r.URL())
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("the cut client's request returned %v, want a reset", err)
	}
	recv(t, started, "the handler to start")
	close(release) // the client has failed; now the server finishes
	if err := recv(t, finished, "the handler to finish"); err != nil {
		t.Fatalf("the handler's context ended (%v): the server saw the client go", err)
	}
	s := wait(t, r, "the dropped response", func(s faultnet.Stats) bool { return s.Cut == 1 && s.Dropped > 0 })
	// The server keeps its keep-alive connection: the target side is still
	// open after the response, so the relayed connection is still live.
	if s.Cut != 1 || s.ToClient != 0 || s.Active != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// CutTarget makes the cut reach the server too: the handler's context ends
// as the client vanishes.
func TestCutAfterRequestAndTarget(t *testing.T) {
	canceled := make(chan error, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		// Reading the body to its end is what starts the server watching
		// the connection for the client going away.
		_, _ = io.Copy(io.Discard, req.Body)
		select {
		case <-req.Context().Done():
		case <-t.Context().Done():
		}
		canceled <- req.Context().Err()
	}))
	t.Cleanup(srv.Close)
	r := start(t, srv.Listener.Addr().String())
	r.Set(faultnet.Fault{CutAfterRequest: 1, CutTarget: true})

	if _, err := post(client(t), r.URL()); err == nil {
		t.Fatal("the cut client's request succeeded")
	}
	if err := recv(t, canceled, "the handler to see the cut"); !errors.Is(err, context.Canceled) {
		t.Fatalf("the handler's context: %v, want canceled", err)
	}
	wait(t, r, "the connection to end", func(s faultnet.Stats) bool { return s.Cut == 1 && s.Active == 0 })
}

// Hang delivers the request and drops the response: the server has done
// its work and answered, and the client is still waiting. Once the client
// gives up, the relayed connection ends.
func TestHang(t *testing.T) {
	h := newHandled(t)
	r := start(t, h.addr())
	r.Set(faultnet.Fault{Hang: true})

	giveUp, cancel := context.WithCancel(t.Context())
	defer cancel()
	req, err := http.NewRequestWithContext(giveUp, http.MethodPost, r.URL(), strings.NewReader("charge 42"))
	if err != nil {
		t.Fatal(err)
	}
	c := client(t)
	failed := make(chan error, 1)
	go func() {
		resp, err := c.Do(req)
		if err == nil {
			_ = resp.Body.Close()
		}
		failed <- err
	}()
	h.await(t, 1)
	wait(t, r, "the response to be dropped", func(s faultnet.Stats) bool { return s.Dropped > 0 })
	select {
	case err := <-failed:
		t.Fatalf("the client stopped waiting: %v", err)
	default: // nothing can reach it
	}
	cancel()
	if err := recv(t, failed, "the client to give up"); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want the client's cancellation", err)
	}
	s := wait(t, r, "the connection to end", func(s faultnet.Stats) bool { return s.Active == 0 })
	if s.ToClient != 0 || s.Cut != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// A client with a timeout fails with a timeout.
func TestHangTimesOut(t *testing.T) {
	h := newHandled(t)
	r := start(t, h.addr())
	r.Set(faultnet.Fault{Hang: true})
	c := client(t)
	c.Timeout = 100 * time.Millisecond
	_, err := post(c, r.URL())
	if ne, ok := errors.AsType[net.Error](err); !ok || !ne.Timeout() {
		t.Fatalf("a hung request returned %v, want a timeout", err)
	}
}

// Hang also withholds the target's end of input: the server closing does
// not reach the client.
func TestHangWithholdsEOF(t *testing.T) {
	r := start(t, tcpServer(t, func(c net.Conn) {
		_, _ = c.Write([]byte("bye"))
		_ = c.Close()
	}))
	r.Set(faultnet.Fault{Hang: true})
	c := dial(t, r.Addr())
	wait(t, r, "the goodbye to be dropped", func(s faultnet.Stats) bool { return s.Dropped == 3 })
	// Once the relay has read the end of input, nothing is on its way to
	// the client: a short read deadline must expire with nothing read.
	if left := settle(patience, func(g string) bool { return strings.Contains(g, "(*conn).pumpResponses") }); len(left) > 0 {
		t.Fatal("the relay is still reading from the target")
	}
	_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if n, err := c.Read(make([]byte, 16)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read %d bytes, %v; want nothing until the deadline", n, err)
	}
	if s := r.Stats(); s.Active != 1 {
		t.Fatalf("stats %+v, want the connection open", s)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(patience))
	if n, err := c.Read(make([]byte, 16)); n != 0 || (err != io.EOF && !errors.Is(err, syscall.ECONNRESET)) {
		t.Fatalf("client read after Close: %d bytes, %v", n, err)
	}
}

// CutAfterResponse forwards exactly that many response bytes, then resets
// the client.
func TestCutAfterResponse(t *testing.T) {
	payload := bytes.Repeat([]byte("0123456789"), 10)
	r := start(t, tcpServer(t, func(c net.Conn) {
		// Answer a request rather than greet: a reset arriving while the
		// client is still in connect fails its dial instead of its read.
		_, _ = c.Read(make([]byte, 1))
		_, _ = c.Write(payload)
		_, _ = io.Copy(io.Discard, c)
	}))
	r.Set(faultnet.Fault{CutAfterResponse: 25})
	c := dial(t, r.Addr())
	if _, err := c.Write([]byte("?")); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(c)
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read: %v, want a reset", err)
	}
	if !bytes.Equal(got, payload[:25]) {
		t.Fatalf("client got %q, want %q", got, payload[:25])
	}
	wait(t, r, "the cut", func(s faultnet.Stats) bool {
		return s.Cut == 1 && s.ToClient == 25 && s.Dropped == 75
	})
}

// Over HTTP, a cut mid-response lets the headers through and breaks the
// body.
func TestCutAfterResponseHTTP(t *testing.T) {
	body := strings.Repeat("x", 64<<10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	r := start(t, srv.Listener.Addr().String())
	r.Set(faultnet.Fault{CutAfterResponse: 1000})

	resp, err := client(t).Get(r.URL())
	if err != nil {
		t.Fatalf("the headers should have arrived: %v", err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err == nil || len(got) >= len(body) {
		t.Fatalf("read %d of %d body bytes, err %v; want a broken body", len(got), len(body), err)
	}
}

// With Hang, CutAfterResponse resets the client as the response starts,
// forwarding none of it.
func TestHangThenCut(t *testing.T) {
	h := newHandled(t)
	r := start(t, h.addr())
	r.Set(faultnet.Fault{Hang: true, CutAfterResponse: 1})
	if _, err := post(client(t), r.URL()); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("got %v, want a reset", err)
	}
	s := wait(t, r, "the cut", func(s faultnet.Stats) bool { return s.Cut == 1 })
	if h.n.Load() != 1 || s.ToClient != 0 {
		t.Fatalf("server handled %d; stats %+v", h.n.Load(), s)
	}
}

// Delays are per direction: a request delayed for an hour never reaches the
// server while the server's greeting reaches the client, and the other way
// round. Close does not wait for a delay to pass.
func TestDelayIsPerDirection(t *testing.T) {
	greet := func(c net.Conn) {
		_, _ = c.Write([]byte("hello"))
		_, _ = io.Copy(io.Discard, c)
	}
	t.Run("request", func(t *testing.T) {
		r := start(t, tcpServer(t, greet))
		r.Set(faultnet.Fault{RequestDelay: time.Hour})
		c := dial(t, r.Addr())
		if _, err := c.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 5)
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "hello" {
			t.Fatalf("greeting %q, %v", buf, err)
		}
		if s := wait(t, r, "the greeting", func(s faultnet.Stats) bool { return s.ToClient == 5 }); s.ToTarget != 0 {
			t.Fatalf("stats %+v", s)
		}
		closeWithin(t, r)
	})
	t.Run("response", func(t *testing.T) {
		got := make(chan string, 1)
		r := start(t, tcpServer(t, func(c net.Conn) {
			buf := make([]byte, 4)
			_, _ = io.ReadFull(c, buf)
			got <- string(buf)
			greet(c)
		}))
		r.Set(faultnet.Fault{ResponseDelay: time.Hour})
		c := dial(t, r.Addr())
		if _, err := c.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		if s := recv(t, got, "the request"); s != "ping" {
			t.Fatalf("server read %q", s)
		}
		if s := wait(t, r, "the request", func(s faultnet.Stats) bool { return s.ToTarget == 4 }); s.ToClient != 0 {
			t.Fatalf("stats %+v", s)
		}
		closeWithin(t, r)
	})
}

// closeWithin closes r and fails the test if Close does not return.
func closeWithin(t *testing.T, r *faultnet.Relay) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- r.Close() }()
	if err := recv(t, done, "Close"); err != nil {
		t.Fatal(err)
	}
}

// A delay holds every chunk at least that long: the server receives the
// request no sooner than RequestDelay after it was sent, and a round trip
// takes at least both delays. (Only lower bounds: a timer never fires early,
// while a busy machine can make anything late.)
func TestDelayAddsLatency(t *testing.T) {
	const d = 100 * time.Millisecond
	arrived := make(chan time.Time, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		arrived <- time.Now()
		fmt.Fprint(w, "ok")
	}))
	t.Cleanup(srv.Close)
	r := start(t, srv.Listener.Addr().String())
	r.Set(faultnet.Fault{RequestDelay: d, ResponseDelay: d})

	sent := time.Now()
	if _, err := post(client(t), r.URL()); err != nil {
		t.Fatal(err)
	}
	total := time.Since(sent)
	if in := recv(t, arrived, "the request").Sub(sent); in < d {
		t.Fatalf("the request arrived after %v, want at least %v", in, d)
	}
	if total < 2*d {
		t.Fatalf("round trip took %v, want at least %v", total, 2*d)
	}
}

// Set reaches a live connection: a keep-alive connection that served one
// request is cut on the next.
func TestSetAppliesToLiveConnections(t *testing.T) {
	h := newHandled(t)
	r := start(t, h.addr())
	c := client(t)
	// One connection at most: the second request waits for the first
	// connection to be idle again rather than dialing.
	c.Transport.(*http.Transport).MaxConnsPerHost = 1
	if _, err := post(c, r.URL()); err != nil {
		t.Fatal(err)
	}
	r.Set(faultnet.Fault{CutAfterRequest: 1})
	if _, err := post(c, r.URL()); err == nil {
		t.Fatal("the second request succeeded")
	}
	wait(t, r, "the cut", func(s faultnet.Stats) bool { return s.Cut == 1 })
	if s := r.Stats(); s.Accepted != 1 {
		t.Fatalf("the client opened %d connections, want its first one reused", s.Accepted)
	}
}

// On a live connection, cut thresholds count from the Set.
func TestSetRestartsCutCount(t *testing.T) {
	r := start(t, tcpServer(t, echo))
	c := dial(t, r.Addr())
	roundTrip := func(n int) error {
		msg := bytes.Repeat([]byte{'x'}, n)
		if _, err := c.Write(msg); err != nil {
			return err
		}
		_, err := io.ReadFull(c, msg)
		return err
	}
	if err := roundTrip(600); err != nil {
		t.Fatal(err)
	}
	r.Set(faultnet.Fault{CutAfterRequest: 1000})
	if err := roundTrip(600); err != nil { // 600 since the Set: not cut
		t.Fatalf("cut after 600 bytes since the Set: %v", err)
	}
	if err := roundTrip(600); !errors.Is(err, syscall.ECONNRESET) { // 1200
		t.Fatalf("got %v, want a reset after 1200 bytes since the Set", err)
	}
	wait(t, r, "the cut", func(s faultnet.Stats) bool { return s.Cut == 1 && s.ToTarget == 1800 })
}

// SetNext faults only the next connections, in the order queued, then the
// relay falls back to the last Set; Set discards what is still queued.
func TestSetNext(t *testing.T) {
	h := newHandled(t)
	r := start(t, h.addr())
	r.SetNext(1, faultnet.Fault{Refuse: true})
	r.SetNext(2, faultnet.Fault{CutAfterRequest: 1})
	r.SetNext(0, faultnet.Fault{Refuse: true}) // no effect

	for i := range 3 {
		if _, err := post(client(t), r.URL()); err == nil {
			t.Fatalf("attempt %d succeeded", i+1)
		}
	}
	h.await(t, 2) // the cut requests reached the server
	if body, err := post(client(t), r.URL()); err != nil || body != "done 3" {
		t.Fatalf("fourth attempt: %q, %v; want the third request the server handled", body, err)
	}
	s := wait(t, r, "the cuts", func(s faultnet.Stats) bool { return s.Cut == 2 })
	if s.Accepted != 4 || s.Refused != 1 {
		t.Fatalf("stats %+v", s)
	}

	r.SetNext(5, faultnet.Fault{Refuse: true})
	r.Set(faultnet.Fault{})
	if body, err := post(client(t), r.URL()); err != nil || body != "done 4" {
		t.Fatalf("after Set: %q, %v", body, err)
	}
}

// WaitForwarded returns once the request reached the target, so a test can
// act at that moment; Wait ends with its context or the relay.
func TestWait(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		select {
		case <-release:
		case <-t.Context().Done():
		}
		fmt.Fprint(w, "ok")
	}))
	t.Cleanup(srv.Close)
	r := start(t, srv.Listener.Addr().String())

	failed := make(chan error, 1)
	c := client(t)
	go func() {
		_, err := post(c, r.URL())
		failed <- err
	}()
	if err := r.WaitForwarded(ctx(t), 1); err != nil {
		t.Fatal(err)
	}
	// The request is at the server and the client waits for the response:
	// make sure it never gets it.
	r.Set(faultnet.Fault{Hang: true, CutAfterResponse: 1})
	close(release)
	if err := recv(t, failed, "the client"); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("the client got %v, want a reset", err)
	}

	short, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := r.Wait(short, func(s faultnet.Stats) bool { return s.Accepted > 1 }); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait with a canceled context: %v", err)
	}

	waiting := make(chan error, 1)
	go func() { waiting <- r.WaitForwarded(context.Background(), 1<<40) }()
	_ = r.Close()
	if err := recv(t, waiting, "Wait to end with the relay"); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Wait after Close: %v", err)
	}
	if _, err := r.Wait(context.Background(), func(s faultnet.Stats) bool { return s.Accepted == 1 }); err != nil {
		t.Fatalf("Wait for a condition that holds, after Close: %v", err)
	}
}

// Close ends every live connection, whatever it is doing, and returns only
// once none of the relay's goroutines is left.
func TestCloseLeavesNothingRunning(t *testing.T) {
	target := tcpServer(t, func(c net.Conn) {
		_, _ = c.Write([]byte("hello"))
		_, _ = io.Copy(io.Discard, c) // never closes first
	})
	r := start(t, target)
	idle := dial(t, r.Addr())
	r.SetNext(1, faultnet.Fault{Hang: true})
	hung := dial(t, r.Addr())
	r.SetNext(1, faultnet.Fault{RequestDelay: time.Hour})
	sleeping := dial(t, r.Addr())
	r.SetNext(1, faultnet.Fault{CutAfterRequest: 1})
	cut := dial(t, r.Addr())
	_, _ = sleeping.Write([]byte("ping"))
	_, _ = cut.Write([]byte("ping"))
	wait(t, r, "every connection", func(s faultnet.Stats) bool {
		return s.Active == 4 && s.Cut == 1 && s.ToClient+s.Dropped == 4*5
	})

	closeWithin(t, r)
	if left := settle(patience, inRelay); len(left) > 0 {
		t.Fatalf("after Close, %d relay goroutines:\n\n%s", len(left), strings.Join(left, "\n\n"))
	}
	if s := r.Stats(); s.Active != 0 {
		t.Fatalf("stats after Close %+v", s)
	}
	for name, c := range map[string]*net.TCPConn{"idle": idle, "hung": hung, "sleeping": sleeping} {
		if _, err := io.ReadAll(c); err != nil && !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("%s client after Close: %v, want its connection closed", name, err)
		}
	}
	if err := r.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// CloseConns ends every live connection, idle ones included, and the relay
// keeps accepting: the next connection takes the queued fault.
func TestCloseConns(t *testing.T) {
	t.Parallel()
	r := start(t, tcpServer(t, echo))
	c := dial(t, r.Addr())
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo: %q %v", buf, err)
	}
	r.SetNext(1, faultnet.Fault{Refuse: true})
	r.CloseConns()
	_ = c.SetReadDeadline(time.Now().Add(patience))
	if n, err := c.Read(buf); err == nil {
		t.Fatalf("read %d bytes from a closed connection", n)
	}
	wait(t, r, "no live connection", func(s faultnet.Stats) bool { return s.Active == 0 })
	// A refused connection is reset as soon as it is accepted; the reset may
	// reach the client while it is still connecting.
	if refused, err := net.Dial("tcp", r.Addr()); err == nil {
		defer refused.Close()
		_ = refused.SetReadDeadline(time.Now().Add(patience))
		if _, err := refused.Read(buf); err == nil {
			t.Fatal("the queued Refuse did not reach the next connection")
		}
	}
	again := dial(t, r.Addr())
	if _, err := again.Write([]byte("pong")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(again, buf); err != nil || string(buf) != "pong" {
		t.Fatalf("after CloseConns: %q %v", buf, err)
	}
}
