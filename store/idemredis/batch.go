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
// is waiting for.
const (
	callQueued int32 = iota
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
	done  chan struct{} // closed when claim and err are set
	claim idem.Claim
	err   error
}

// claimBatcher gathers the claims that arrive while earlier ones are in
// flight and sends them as one claim script call: the script's fixed cost
// (EVALSHA, TIME, formatting the record header), the round trip and the
// system calls are paid once per call instead of once per claim. Each key is
// still claimed atomically and in arrival order.
//
// There is no timer. A claim that finds fewer than claimsInFlight senders
// starts one, which sends the queue (this claim alone, if nobody else is
// waiting) at once, and keeps sending what queued meanwhile until the queue
// is empty. A sender is a goroutine of its own, so that every caller can
// stop waiting when its context ends while the call that carries its claim,
// and others', goes on. Senders use a dedicated connection from the
// client's pool, which rueidis drives synchronously from the sender instead
// of through its pipelining goroutines: fewer hand-offs per call.
type claimBatcher struct {
	s        *Store
	maxBatch int

	mu      sync.Mutex
	queue   []*claimCall
	senders int // at most claimsInFlight
}

// claim queues c and returns its outcome, or an error once ctx ends.
func (b *claimBatcher) claim(ctx context.Context, c *claimCall) (idem.Claim, error) {
	if err := context.Cause(ctx); err != nil {
		return idem.Claim{}, b.s.wrap("claim", err)
	}
	c.done = make(chan struct{})
	b.mu.Lock()
	b.queue = append(b.queue, c)
	start := b.senders < claimsInFlight
	if start {
		b.senders++
	}
	b.mu.Unlock()
	if start {
		go b.send()
	}
	select {
	case <-c.done:
		return c.claim, c.err
	case <-ctx.Done():
		if c.state.CompareAndSwap(callQueued, callAbandoned) || c.state.CompareAndSwap(callSent, callAbandoned) {
			return idem.Claim{}, b.s.wrap("claim", context.Cause(ctx))
		}
		<-c.done // the reply arrived as ctx ended: report it
		return c.claim, c.err
	}
}

// send sends batches until the queue is empty.
func (b *claimBatcher) send() {
	conn, release := b.s.client.Dedicate()
	for {
		b.mu.Lock()
		batch := b.takeLocked()
		if len(batch) == 0 {
			b.senders--
			b.mu.Unlock()
			release()
			return
		}
		b.mu.Unlock()
		// The call carries other callers' claims, so it must not end with
		// the first one's context; the context's values (trace spans) are
		// kept.
		if err := b.s.execClaims(context.WithoutCancel(batch[0].ctx), conn, batch); err != nil {
			// A broken connection goes back to the pool, which drops it.
			release()
			conn, release = b.s.client.Dedicate()
		}
		for _, c := range batch {
			if !c.state.CompareAndSwap(callSent, callDone) && c.err == nil && c.claim.Outcome == idem.Acquired {
				go b.s.releaseAbandoned(c)
			}
			close(c.done)
		}
	}
}

// takeLocked takes from the queue the first waiting call and, up to
// maxBatch, the waiting calls with the same lease, skipping the calls
// abandoned while queued. Calls with another lease keep their place for a
// later batch.
func (b *claimBatcher) takeLocked() []*claimCall {
	var batch []*claimCall
	kept := b.queue[:0]
	for _, q := range b.queue {
		switch {
		case len(batch) < b.maxBatch && (len(batch) == 0 || q.lease.ms == batch[0].lease.ms) &&
			q.state.CompareAndSwap(callQueued, callSent):
			if batch == nil {
				batch = make([]*claimCall, 0, min(len(b.queue), b.maxBatch))
			}
			batch = append(batch, q)
		case q.state.Load() == callQueued:
			kept = append(kept, q)
		}
	}
	clear(b.queue[len(kept):])
	b.queue = kept
	return batch
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
