package faultnet

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"
)

// bufSize is the size of each of a connection's two relay buffers.
const bufSize = 32 << 10

// A Fault is what the relay does to a connection. The zero value passes
// bytes through both ways. "Request" bytes flow from the client to the
// target, "response" bytes from the target to the client, whatever the
// protocol.
type Fault struct {
	// Refuse resets a new connection as soon as it is accepted, without
	// dialing the target. The client sees the reset on its dial, or on its
	// first read or write if its connect returned first. Refuse has no
	// effect on live connections.
	Refuse bool

	// RequestDelay is waited before forwarding each chunk of request bytes
	// (one read from the client, at most 32 KiB), ResponseDelay before each
	// chunk of response bytes. The two directions are delayed independently.
	RequestDelay  time.Duration
	ResponseDelay time.Duration

	// CutAfterRequest, when positive, cuts the connection once at least that
	// many request bytes have been written to the target: the chunk that
	// reaches the count is forwarded whole, then the client is reset. Nothing
	// the target sends from then on reaches the client, however fast it
	// answers. The target side stays open and what arrives on it is dropped,
	// so the server sees neither an end of input nor a reset. With 1, the
	// client is cut right after its first write reaches the target: for an
	// HTTP request sent with one write, as net/http sends small requests,
	// that is the whole request.
	CutAfterRequest int64

	// CutAfterResponse, when positive, cuts the connection once that many
	// response bytes have arrived from the target. Exactly that many are
	// forwarded first, unless Hang drops them.
	CutAfterResponse int64

	// CutTarget makes a cut reset the target side too, so the server sees its
	// client vanish.
	CutTarget bool

	// Hang drops every response byte instead of forwarding it, and keeps
	// the target's end of input from reaching the client: the client waits
	// for a response that never comes. Request bytes are still forwarded.
	// Bytes dropped while Hang is set are lost, not delivered later.
	Hang bool
}

// Stats are a relay's counters since [Start].
type Stats struct {
	Accepted   int64 // connections accepted, refused ones included
	Active     int64 // connections being relayed now
	Refused    int64 // connections reset on accept by Fault.Refuse
	DialFailed int64 // connections reset because the target could not be dialed
	Cut        int64 // connections cut by CutAfterRequest or CutAfterResponse
	ToTarget   int64 // request bytes written to the target
	ToClient   int64 // response bytes written to the client
	Dropped    int64 // response bytes read from the target and dropped
}

// A Relay accepts TCP connections on a loopback port and relays each one to
// its target, applying the current [Fault]. Its methods are safe for
// concurrent use.
type Relay struct {
	target string
	ln     net.Listener
	ctx    context.Context // canceled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // the accept loop and every connection

	mu     sync.Mutex
	closed bool
	fault  Fault  // set by Set
	gen    uint64 // incremented by Set
	next   []pending
	conns  map[*conn]struct{}
	stats  Stats
	notify chan struct{} // closed and cleared when stats change; nil without waiters
}

// pending is a fault SetNext queued for the next n connections.
type pending struct {
	f Fault
	n int
}

// Start listens on 127.0.0.1 on a free port and relays every connection it
// accepts to target, a host:port, dialing the target once per connection.
// It does not check that the target is up. Call [Relay.Close] when done.
func Start(target string) (*Relay, error) {
	if _, _, err := net.SplitHostPort(target); err != nil {
		return nil, fmt.Errorf("faultnet: target %q: %w", target, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultnet: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Relay{
		target: target,
		ln:     ln,
		ctx:    ctx,
		cancel: cancel,
		conns:  make(map[*conn]struct{}),
	}
	r.wg.Add(1)
	go r.serve()
	return r, nil
}

// Addr returns the address the relay listens on, as host:port.
func (r *Relay) Addr() string { return r.ln.Addr().String() }

// URL returns "http://" followed by [Relay.Addr].
func (r *Relay) URL() string { return "http://" + r.Addr() }

// Set makes f the fault of every live connection and of every new one, and
// discards the faults SetNext queued. On a live connection it takes effect
// from the next chunk read, and its cut thresholds count bytes from there;
// Refuse only affects new connections, and a connection already cut stays
// cut.
func (r *Relay) Set(f Fault) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fault = f
	r.gen++
	r.next = nil
}

// SetNext gives f to the next n connections the relay accepts, after those
// queued by earlier SetNext calls; later connections take the fault of the
// last Set again. A connection keeps f until it ends or Set is called.
// SetNext does nothing if n < 1.
func (r *Relay) SetNext(n int, f Fault) {
	if n < 1 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.next = append(r.next, pending{f: f, n: n})
}

// Stats returns the relay's counters.
func (r *Relay) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stats
}

// Wait blocks until cond returns true for the relay's counters and returns
// those counters. It returns early with ctx's error when ctx is done, or
// with [net.ErrClosed] when the relay is closed and cond is still false.
// cond is called without locks held, once per change of the counters.
func (r *Relay) Wait(ctx context.Context, cond func(Stats) bool) (Stats, error) {
	for {
		r.mu.Lock()
		s, closed := r.stats, r.closed
		if r.notify == nil && !closed {
			r.notify = make(chan struct{})
		}
		changed := r.notify
		r.mu.Unlock()
		if cond(s) {
			return s, nil
		}
		if closed {
			return s, net.ErrClosed
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return s, ctx.Err()
		}
	}
}

// WaitForwarded blocks until at least n request bytes in all, counted since
// [Start], have been written to the target: to wait for k more bytes, pass
// Stats().ToTarget + k. It returns like [Relay.Wait].
func (r *Relay) WaitForwarded(ctx context.Context, n int64) error {
	_, err := r.Wait(ctx, func(s Stats) bool { return s.ToTarget >= n })
	return err
}

// Close stops the relay: it closes the listener and every live connection,
// wakes every Wait, and returns once all of the relay's goroutines have
// exited. It returns the listener's close error; later calls return nil
// after the first one has finished.
func (r *Relay) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		r.wg.Wait()
		return nil
	}
	r.closed = true
	r.cancel()
	err := r.ln.Close()
	live := make([]*conn, 0, len(r.conns))
	for c := range r.conns {
		live = append(live, c)
	}
	r.changedLocked()
	r.mu.Unlock()
	for _, c := range live {
		c.shutdown()
	}
	r.wg.Wait()
	return err
}

// CloseConns closes both sides of every live connection and leaves the
// relay listening. A client's idle keep-alive connections go too, so its
// next request opens a new connection, which takes the faults SetNext
// queued.
func (r *Relay) CloseConns() {
	r.mu.Lock()
	live := make([]*conn, 0, len(r.conns))
	for c := range r.conns {
		live = append(live, c)
	}
	r.mu.Unlock()
	for _, c := range live {
		c.shutdown()
	}
}

// serve is the accept loop.
func (r *Relay) serve() {
	defer r.wg.Done()
	var backoff time.Duration
	for {
		nc, err := r.ln.Accept()
		if err != nil {
			if r.ctx.Err() != nil {
				return
			}
			// A temporary failure such as running out of file descriptors:
			// back off as net/http does rather than spin.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			if !r.sleep(backoff) {
				return
			}
			continue
		}
		backoff = 0
		r.accept(nc.(*net.TCPConn))
	}
}

// accept picks the fault of a new connection and starts relaying it.
func (r *Relay) accept(client *net.TCPConn) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		_ = client.Close()
		return
	}
	r.stats.Accepted++
	f := r.fault
	if len(r.next) > 0 {
		f = r.next[0].f
		if r.next[0].n--; r.next[0].n == 0 {
			r.next = append(r.next[:0], r.next[1:]...)
		}
	}
	if f.Refuse {
		r.mu.Unlock()
		reset(client)
		r.count(func(s *Stats) { s.Refused++ })
		return
	}
	c := &conn{r: r, client: client, fault: f, gen: r.gen}
	r.conns[c] = struct{}{}
	r.stats.Active++
	r.changedLocked()
	r.wg.Add(1)
	r.mu.Unlock()
	go c.run()
}

// remove forgets a connection that has ended.
func (r *Relay) remove(c *conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.conns, c)
	r.stats.Active--
	r.changedLocked()
}

// current returns the fault last Set and its generation.
func (r *Relay) current() (Fault, uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fault, r.gen
}

// count updates the counters and wakes the waiters.
func (r *Relay) count(update func(*Stats)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	update(&r.stats)
	r.changedLocked()
}

func (r *Relay) changedLocked() {
	if r.notify != nil {
		close(r.notify)
		r.notify = nil
	}
}

// sleep waits for d and reports false if the relay was closed meanwhile.
func (r *Relay) sleep(d time.Duration) bool {
	if d <= 0 {
		return r.ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.ctx.Done():
		return false
	}
}

// reset closes c with SO_LINGER 0, so its peer gets a TCP reset.
func reset(c *net.TCPConn) {
	_ = c.SetLinger(0)
	_ = c.Close()
}
