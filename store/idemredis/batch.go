package idemredis

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
	"github.com/redis/rueidis"
)

// DefaultMaxClaimBatch is the default of [Config.MaxClaimBatch].
const DefaultMaxClaimBatch = 64

// claimsInFlight is how many claim calls a store keeps in flight at once on
// a standalone or sentinel client. Two keep Redis busy while the previous
// reply travels back and is decoded; more split the same callers into
// smaller calls, each paying the script's fixed cost.
const claimsInFlight = 2

// releaseAbandonedTimeout bounds the Release of a lease whose caller gave
// up while its claim was in flight.
const releaseAbandonedTimeout = 5 * time.Second

// The states of a claimCall. A waiter whose context ends takes a queued
// call out of the queue (callQueued to callAbandoned) or leaves a sent call
// to its sender (callSent to callAbandoned), which releases a lease nobody
// is waiting for. A call chosen to lead the next batch (callLeading) is
// sent by its own goroutine, whose context no longer matters.
const (
	callQueued int32 = iota
	callLeading
	callSent
	callDone
	callAbandoned
)

// claimCall is one Store.Claim on its way to Redis.
type claimCall struct {
	ctx   context.Context
	key   string // the record's Redis key
	id    string // identity (see scripts.go)
	lease *leaseText
	state atomic.Int32
	// wake receives one signal: the call is done, or (state callLeading) its
	// goroutine must send the next batch.
	wake  chan struct{}
	conn  leaderConn // the connection handed to a call chosen to lead
	claim idem.Claim
	err   error
}

// leaderConn is the dedicated connection that a batch's leader sends on,
// handed from leader to leader while claims keep coming and given back to
// the client's pool when the queue empties.
type leaderConn struct {
	c       rueidis.DedicatedClient
	release func()
}

// claimBatcher gathers the claims that arrive while earlier ones are in
// flight and sends them as one claim script call: the script's fixed cost
// (EVALSHA, TIME, formatting the record header), the round trip and the
// system calls are paid once per call instead of once per claim. Each key is
// still claimed atomically and in arrival order.
//
// There is no background goroutine and no timer. A claim that finds fewer
// than claimsInFlight calls in flight leads: its own goroutine takes the
// queue (itself first) and sends it at once, so a lone claim costs one round
// trip. A claim that finds the calls in flight waits in the queue; when a
// leader's call returns and the queue is not empty, the leader wakes the
// first waiter to lead the next call, hands it its connection and returns.
// Leaders send on a dedicated connection from the client's pool, which
// rueidis drives synchronously from the leader's goroutine instead of
// through its pipelining goroutines.
type claimBatcher struct {
	s        *Store
	maxBatch int

	mu      sync.Mutex
	queue   []*claimCall
	leaders int // calls being sent, at most claimsInFlight
}

// claim queues c and returns its outcome, or an error once ctx ends.
func (b *claimBatcher) claim(ctx context.Context, c *claimCall) (idem.Claim, error) {
	if err := context.Cause(ctx); err != nil {
		return idem.Claim{}, b.s.wrap("claim", err)
	}
	c.wake = make(chan struct{}, 1)
	b.mu.Lock()
	b.queue = append(b.queue, c)
	lead := b.leaders < claimsInFlight
	if lead {
		b.leaders++
		c.state.Store(callLeading)
	}
	b.mu.Unlock()
	if lead {
		b.lead(c, leaderConn{})
	}
	done := ctx.Done()
	for {
		select {
		case <-c.wake:
			if c.state.Load() == callLeading {
				b.lead(c, c.conn)
				continue
			}
			return c.claim, c.err
		case <-done:
			if c.state.CompareAndSwap(callQueued, callAbandoned) || c.state.CompareAndSwap(callSent, callAbandoned) {
				return idem.Claim{}, b.s.wrap("claim", context.Cause(ctx))
			}
			// Leading, or done: the signal is on its way.
			done = nil
		}
	}
}

// lead sends one batch, which starts with c, on conn (or a connection
// taken from the client's pool), then hands the connection to the next
// leader or gives it back.
func (b *claimBatcher) lead(c *claimCall, conn leaderConn) {
	if conn.c == nil {
		conn.c, conn.release = b.s.client.Dedicate()
	}
	b.mu.Lock()
	batch := b.takeLocked(c)
	b.mu.Unlock()

	// The call carries other callers' claims, so it must not end with the
	// leader's context; the context's values (trace spans) are kept.
	if err := b.s.execClaims(context.WithoutCancel(c.ctx), conn.c, batch); err != nil {
		// A broken connection goes back to the pool, which drops it; the
		// next leader takes a fresh one.
		conn.release()
		conn = leaderConn{}
	}
	// The next leader first: its batch is waiting, and Redis may be idle.
	b.mu.Lock()
	next := b.nextLeaderLocked()
	if next == nil {
		b.leaders--
	}
	b.mu.Unlock()
	if next != nil {
		next.conn = conn
		next.wake <- struct{}{}
	} else if conn.c != nil {
		conn.release()
	}
	for _, bc := range batch {
		if !bc.state.CompareAndSwap(callSent, callDone) && bc.err == nil && bc.claim.Outcome == idem.Acquired {
			go b.s.releaseAbandoned(bc)
		}
		bc.wake <- struct{}{}
	}
}

// takeLocked moves to a batch the leader c (first in the queue among the
// calls still waiting) and then, up to maxBatch, the queued calls with the
// same lease, skipping the calls abandoned while queued. Calls with another
// lease keep their place for a later batch.
func (b *claimBatcher) takeLocked(c *claimCall) []*claimCall {
	c.state.Store(callSent)
	batch := make([]*claimCall, 1, min(len(b.queue)+1, b.maxBatch))
	batch[0] = c
	kept := b.queue[:0]
	for _, q := range b.queue {
		switch {
		case q == c:
		case len(batch) < b.maxBatch && q.lease.ms == c.lease.ms && q.state.CompareAndSwap(callQueued, callSent):
			batch = append(batch, q)
		case q.state.Load() == callQueued:
			kept = append(kept, q)
		}
	}
	clear(b.queue[len(kept):])
	b.queue = kept
	return batch
}

// nextLeaderLocked picks the first queued call to lead the next batch, or
// nil when no call is waiting.
func (b *claimBatcher) nextLeaderLocked() *claimCall {
	for _, q := range b.queue {
		if q.state.CompareAndSwap(callQueued, callLeading) {
			return q
		}
	}
	clear(b.queue)
	b.queue = b.queue[:0]
	return nil
}

// releaseAbandoned releases the lease of a claim whose caller stopped
// waiting while the claim was in flight, so that the key does not stay in
// progress until the lease expires. If the release fails, the lease
// expires as usual.
func (s *Store) releaseAbandoned(c *claimCall) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.ctx), releaseAbandonedTimeout)
	defer cancel()
	_ = s.releaseKey(ctx, c.key, c.claim.Token)
}

// claimSHA is the SHA-1 that EVALSHA names the claim script by.
var claimSHA = func() string {
	h := sha1.Sum([]byte(claimScript))
	return hex.EncodeToString(h[:])
}()

// execClaims runs the claim script once for calls, which share a lease, on
// conn, or through the client when conn is nil, and sets each call's claim
// or error. It returns the error of the connection, if any.
func (s *Store) execClaims(ctx context.Context, conn rueidis.DedicatedClient, calls []*claimCall) error {
	keys := make([]string, len(calls))
	args := make([]string, 2, 2+len(calls))
	args[0], args[1] = s.abandonMS, calls[0].lease.s
	for i, c := range calls {
		keys[i] = c.key
		args = append(args, c.id)
	}
	var r rueidis.RedisResult
	if conn == nil {
		r = claimLua.Exec(ctx, s.client, keys, args)
	} else {
		r = conn.Do(ctx, conn.B().Evalsha().Sha1(claimSHA).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build())
		if rerr, ok := rueidis.IsRedisErr(r.Error()); ok && rerr.IsNoScript() {
			r = conn.Do(ctx, conn.B().Eval().Script(claimScript).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build())
		}
	}
	vals, err := r.ToArray()
	if err == nil && len(vals) != 2+len(calls) {
		err = fmt.Errorf("reply has %d elements, want %d", len(vals), 2+len(calls))
	}
	var token, now int64
	if err == nil {
		var err1, err2 error
		token, err1 = vals[0].AsInt64()
		now, err2 = vals[1].AsInt64()
		err = errors.Join(err1, err2)
	}
	for i, c := range calls {
		if err != nil {
			c.err = s.wrap("claim", err)
			continue
		}
		c.claim, c.err = s.decodeClaim(c, token, now, &vals[i+2])
	}
	return r.NonRedisError()
}

// decodeClaim decodes one item of the claim script's reply.
func (s *Store) decodeClaim(c *claimCall, token, now int64, item *rueidis.RedisMessage) (idem.Claim, error) {
	if item.IsInt64() {
		if n, _ := item.AsInt64(); n != 1 {
			return idem.Claim{}, fmt.Errorf("idemredis: claim: unknown item %d", n)
		}
		return idem.Claim{Outcome: idem.Acquired, Token: token, LeaseExpiresAt: time.UnixMilli(now + c.lease.ms)}, nil
	}
	if err := item.Error(); err != nil {
		return idem.Claim{}, s.wrap("claim", err)
	}
	vals, err := item.ToArray()
	if err != nil {
		return idem.Claim{}, fmt.Errorf("idemredis: claim: %w", err)
	}
	if len(vals) == 0 {
		return idem.Claim{}, errors.New("idemredis: claim: empty item")
	}
	code, err := vals[0].AsInt64()
	if err != nil {
		return idem.Claim{}, fmt.Errorf("idemredis: claim: %w", err)
	}
	switch outcome := idem.Outcome(code); outcome {
	case idem.Acquired:
		if len(vals) != 4 {
			return idem.Claim{}, fmt.Errorf("idemredis: claim: item has %d elements", len(vals))
		}
		tok, err1 := vals[1].AsInt64()
		le, err2 := vals[2].AsInt64()
		takeover, err3 := vals[3].AsInt64()
		if err := errors.Join(err1, err2, err3); err != nil {
			return idem.Claim{}, fmt.Errorf("idemredis: claim: %w", err)
		}
		return idem.Claim{Outcome: idem.Acquired, Token: tok, Takeover: takeover == 1, LeaseExpiresAt: time.UnixMilli(le)}, nil
	case idem.InProgress, idem.Completed, idem.Mismatch:
		if len(vals) != 2 {
			return idem.Claim{}, fmt.Errorf("idemredis: claim: item has %d elements", len(vals))
		}
		raw, err := vals[1].ToString()
		if err != nil {
			return idem.Claim{}, fmt.Errorf("idemredis: claim: %w", err)
		}
		rec, err := parseRecord(raw)
		if err != nil {
			return idem.Claim{}, fmt.Errorf("idemredis: claim: %w", err)
		}
		return idem.Claim{Outcome: outcome, Record: &rec}, nil
	case 0:
		return idem.Claim{}, fmt.Errorf("idemredis: claim: key %s: %w", c.key, ErrRecordFormat)
	default:
		return idem.Claim{}, fmt.Errorf("idemredis: claim: unknown outcome %d", code)
	}
}
