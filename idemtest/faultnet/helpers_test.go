package faultnet_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/idemtest/faultnet"
)

// patience bounds every wait in these tests. Nothing is expected to take
// anywhere near this long; it only turns a bug into a failure instead of a
// hang, even on a loaded machine.
const patience = 30 * time.Second

// TestMain fails the run if any goroutine outlives the tests: the relay's,
// the HTTP servers' and clients', or the tests' own.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if leaked := settle(10*time.Second, func(string) bool { return true }); len(leaked) > 0 {
			fmt.Fprintf(os.Stderr, "leaked goroutines:\n\n%s\n", strings.Join(leaked, "\n\n"))
			code = 1
		}
	}
	os.Exit(code)
}

// settle polls the goroutines other than the caller until none matches
// keep or the timeout passes, and returns the stacks of those still there.
func settle(timeout time.Duration, keep func(stack string) bool) []string {
	deadline := time.Now().Add(timeout)
	for {
		var found []string
		for _, g := range goroutines()[1:] { // the first one is the caller
			if keep(g) {
				found = append(found, g)
			}
		}
		if len(found) == 0 || time.Now().After(deadline) {
			return found
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func goroutines() []string {
	buf := make([]byte, 64<<10)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Split(strings.TrimSpace(string(buf[:n])), "\n\n")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// inRelay reports whether a goroutine is running the relay's code.
func inRelay(stack string) bool {
	return strings.Contains(stack, "idemtest/faultnet.(*")
}

// start starts a relay to target that the test closes when it ends.
func start(t *testing.T, target string) *faultnet.Relay {
	t.Helper()
	r, err := faultnet.Start(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// ctx returns a context that ends with the test or after patience.
func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), patience)
	t.Cleanup(cancel)
	return c
}

// wait waits for the relay's counters to satisfy cond.
func wait(t *testing.T, r *faultnet.Relay, what string, cond func(faultnet.Stats) bool) faultnet.Stats {
	t.Helper()
	s, err := r.Wait(ctx(t), cond)
	if err != nil {
		t.Fatalf("waiting for %s: %v (stats %+v)", what, err, s)
	}
	return s
}

// recv receives from ch or fails the test after patience.
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(patience):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// tcpServer serves handle on every connection to a new loopback listener
// and returns its address. When the test ends it closes the listener and
// every connection, then waits for the handlers.
func tcpServer(t *testing.T, handle func(net.Conn)) string {
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
			wg.Go(func() { handle(c) })
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

// echo copies a connection's input back to it and half-closes it at the
// end of input.
func echo(c net.Conn) {
	_, _ = io.Copy(c, c)
	_ = c.(*net.TCPConn).CloseWrite()
}

// dial connects to addr; the connection is closed when the test ends.
func dial(t *testing.T, addr string) *net.TCPConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(patience))
	return c.(*net.TCPConn)
}

// client returns an HTTP client with a transport of its own, so that its
// first request always opens a new connection (which net/http never
// retries), and keep-alives as in production.
func client(t *testing.T) *http.Client {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: patience}
}

// post sends a POST with a small body, which net/http does not retry.
func post(c *http.Client, url string) (string, error) {
	resp, err := c.Post(url, "text/plain", strings.NewReader("charge 42"))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}
