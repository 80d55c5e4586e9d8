package faultnet

import (
	"errors"
	"io"
	"net"
	"sync"
)

// A conn is one relayed connection: the client the relay accepted and the
// target it dialed for it. Two pumps move bytes, one per direction.
type conn struct {
	r      *Relay
	client *net.TCPConn

	mu       sync.Mutex
	target   *net.TCPConn // nil until dialed
	shut     bool         // the relay is closing
	fault    Fault
	gen      uint64 // the relay generation fault came from
	sent     int64  // request bytes written to the target under fault
	received int64  // response bytes read from the target under fault
	cut      bool
}

// run dials the target, relays until both directions have ended, and
// closes both sides.
func (c *conn) run() {
	defer c.r.wg.Done()
	defer c.r.remove(c)

	var d net.Dialer
	nc, err := d.DialContext(c.r.ctx, "tcp", c.r.target)
	if err != nil {
		reset(c.client)
		if c.r.ctx.Err() == nil {
			c.r.count(func(s *Stats) { s.DialFailed++ })
		}
		return
	}
	target := nc.(*net.TCPConn)
	c.mu.Lock()
	shut := c.shut
	if !shut {
		c.target = target
	}
	c.mu.Unlock()
	if shut {
		_ = target.Close()
		_ = c.client.Close()
		return
	}

	responses := make(chan struct{})
	go func() {
		defer close(responses)
		c.pumpResponses(target)
	}()
	c.pumpRequests(target)
	<-responses
	_ = c.client.Close()
	_ = target.Close()
}

// pumpRequests moves bytes from the client to the target until the client
// stops sending: an end of input is passed on as a half-close, an error
// resets both sides, and a cut client leaves the target alone.
func (c *conn) pumpRequests(target *net.TCPConn) {
	buf := make([]byte, bufSize)
	for {
		n, err := c.client.Read(buf)
		if n > 0 {
			f, gen := c.refresh()
			if !c.r.sleep(f.RequestDelay) {
				return
			}
			// Decide on the cut before the chunk reaches the target, so that
			// no response to it can slip through to the client first.
			c.mu.Lock()
			cutNow := false
			if c.gen == gen && !c.cut {
				c.sent += int64(n)
				cutNow = f.CutAfterRequest > 0 && c.sent >= f.CutAfterRequest
				c.cut = cutNow
			}
			c.mu.Unlock()
			_, werr := target.Write(buf[:n])
			if werr == nil {
				c.r.count(func(s *Stats) { s.ToTarget += int64(n) })
			}
			if cutNow {
				c.cutOff(f.CutTarget)
			}
			if werr != nil {
				c.abort()
				return
			}
		}
		if err != nil {
			switch {
			case c.isCut():
			case errors.Is(err, io.EOF):
				_ = target.CloseWrite()
			default:
				c.abort()
			}
			return
		}
	}
}

// pumpResponses moves bytes from the target to the client, dropping those
// the fault withholds, until the target stops sending.
func (c *conn) pumpResponses(target *net.TCPConn) {
	buf := make([]byte, bufSize)
	for {
		n, err := target.Read(buf)
		if n > 0 && !c.deliver(buf[:n]) {
			return
		}
		if err != nil {
			f, _ := c.refresh()
			switch {
			case c.isCut():
			case errors.Is(err, io.EOF):
				if !f.Hang {
					_ = c.client.CloseWrite()
				}
			default:
				c.abort()
			}
			return
		}
	}
}

// deliver forwards what the fault lets through of p, a chunk read from the
// target, and drops the rest. It reports false when the pump should stop.
func (c *conn) deliver(p []byte) bool {
	n := int64(len(p))
	rf, rgen := c.r.current()
	c.mu.Lock()
	f := c.adoptLocked(rf, rgen)
	before := c.received
	c.received += n
	fwd := n
	switch {
	case c.cut || f.Hang:
		fwd = 0
	case f.CutAfterResponse > 0:
		fwd = min(n, max(f.CutAfterResponse-before, 0))
	}
	cutNow := !c.cut && f.CutAfterResponse > 0 && c.received >= f.CutAfterResponse
	c.cut = c.cut || cutNow
	c.mu.Unlock()

	if fwd > 0 {
		if !c.r.sleep(f.ResponseDelay) {
			return false
		}
		if _, err := c.client.Write(p[:fwd]); err != nil {
			if !c.isCut() {
				c.abort()
				return false
			}
			fwd = 0 // cut meanwhile by the request pump
		}
	}
	if cutNow {
		c.cutOff(f.CutTarget)
	}
	c.r.count(func(s *Stats) {
		s.ToClient += fwd
		s.Dropped += n - fwd
	})
	return true
}

// refresh adopts the relay's fault if Set was called since the connection
// last looked, and returns the connection's fault and its generation.
func (c *conn) refresh() (Fault, uint64) {
	rf, rgen := c.r.current()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.adoptLocked(rf, rgen), c.gen
}

// adoptLocked makes f, from generation gen of the relay's Set calls, the
// connection's fault if it is newer than the one it has, restarting the
// cut counts, and returns the connection's fault. The caller holds c.mu.
func (c *conn) adoptLocked(f Fault, gen uint64) Fault {
	if gen > c.gen {
		c.fault, c.gen = f, gen
		c.sent, c.received = 0, 0
	}
	return c.fault
}

// cutOff resets the client side, and the target side too if both is set,
// for the pump that marked the connection cut. From the mark on, both pumps
// drop whatever the target sends.
func (c *conn) cutOff(both bool) {
	reset(c.client)
	if both {
		c.mu.Lock()
		target := c.target
		c.mu.Unlock()
		reset(target)
	}
	c.r.count(func(s *Stats) { s.Cut++ })
}

func (c *conn) isCut() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cut
}

// abort resets both sides after an error on either.
func (c *conn) abort() {
	c.mu.Lock()
	target := c.target
	c.mu.Unlock()
	reset(c.client)
	reset(target)
}

// shutdown closes both sides for Relay.Close; a connection still dialing
// closes them once the dial returns.
func (c *conn) shutdown() {
	c.mu.Lock()
	c.shut = true
	target := c.target
	c.mu.Unlock()
	_ = c.client.Close()
	if target != nil {
		_ = target.Close()
	}
}
