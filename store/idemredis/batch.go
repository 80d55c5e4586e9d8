package idemredis

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
	"github.com/redis/rueidis"
)

// DefaultCoalesce is the default of [Config.Coalesce].
const DefaultCoalesce = 64

// callsInFlight is how many script calls of one kind (claims, or
// completions) a store keeps in flight at once on a standalone or sentinel
// client. Two keep Redis busy while the previous reply travels back and is
// decoded; more split the same callers into smaller calls, each paying the
// script's fixed cost.
const callsInFlight = 2

// releaseAbandonedTimeout bounds the Release of a lease whose caller gave
// up while its claim was in flight.
const releaseAbandonedTimeout = 5 * time.Second

// The states of a call. A waiter whose context ends takes a queued call out
// of the queue (callQueued to callAbandoned) or leaves a sent call to its
// sender (callSent to callAbandoned), which releases a lease nobody is
// waiting for.
const (
	callQueued int32 = iota
	callSent
	callDone
	callAbandoned
)

// call is one Store.Claim or Store.Complete on its way to Redis.
type call struct {
	ctx   context.Context
	key   string // the record's Redis key
	state atomic.Int32
	done  chan struct{} // closed when the outcome is set
	err   error

	// Claim.
	id    string // identity (see scripts.go)
	lease *leaseText
	claim idem.Claim

	// Complete.
	token     int64
	tokenText string
	result    string
	flags     string // failed and tombstone, two bytes of 0|1
	retention string // ms
}

// batcher gathers the calls of one kind that arrive while earlier ones are
// in flight and sends them as one script call: the script's fixed cost
// (EVALSHA, TIME, formatting), the round trip and the system calls are paid
// once per call instead of once per claim or completion. Each key is still
// handled atomically and in arrival order.
//
// There is no timer. A call that finds nothing queued and fewer than
// callsInFlight script calls in flight is sent alone, at once, from its
// caller's goroutine through the client, as without batching: a store with
// few callers pays no hand-off. A call that finds others waiting, or the
// calls in flight, queues; when fewer than callsInFlight calls are in
// flight it starts a sender (so does a lone call that returns to a non-empty
// queue), which sends up to maxBatch queued calls at once and keeps sending
// what queued meanwhile until the queue is empty. A sender is a goroutine of
// its own, so that every queued caller can stop waiting when its context
// ends while the script call that carries its work, and others', goes on.
type batcher struct {
	s        *Store
	op       string
	maxBatch int
	// exec runs one script call for calls and sets their outcomes.
	exec func(ctx context.Context, calls []*call)
	// fits reports whether c can join a batch that starts with first.
	fits func(first, c *call) bool
	// abandoned, if set, is called for a call that succeeded after its
	// caller stopped waiting.
	abandoned func(c *call)

	mu       sync.Mutex
	queue    []*call
	inFlight int // script calls being sent: lone calls and senders, at most callsInFlight
}

// do sends c alone when nothing is waiting, or else queues it and waits
// for its outcome, or returns an error once ctx ends.
func (b *batcher) do(ctx context.Context, c *call) error {
	if err := context.Cause(ctx); err != nil {
		return b.s.wrap(b.op, err)
	}
	c.ctx = ctx
	b.mu.Lock()
	if b.inFlight < callsInFlight && len(b.queue) == 0 {
		// Nothing is waiting: send c alone, from the caller's goroutine,
		// through the client.
		b.inFlight++
		b.mu.Unlock()
		b.exec(ctx, []*call{c})
		b.mu.Lock()
		start := len(b.queue) > 0 // arrived meanwhile: this slot sends them
		if !start {
			b.inFlight--
		}
		b.mu.Unlock()
		if start {
			go b.send()
		}
		return c.err
	}
	c.done = make(chan struct{})
	b.queue = append(b.queue, c)
	start := b.inFlight < callsInFlight
	if start {
		b.inFlight++
	}
	b.mu.Unlock()
	if start {
		go b.send()
	}
	select {
	case <-c.done:
		return c.err
	case <-ctx.Done():
		if c.state.CompareAndSwap(callQueued, callAbandoned) || c.state.CompareAndSwap(callSent, callAbandoned) {
			return b.s.wrap(b.op, context.Cause(ctx))
		}
		<-c.done // the reply arrived as ctx ended: report it
		return c.err
	}
}

// send sends batches until the queue is empty.
func (b *batcher) send() {
	for {
		b.mu.Lock()
		batch := b.takeLocked()
		if len(batch) == 0 {
			b.inFlight--
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		// The call carries other callers' work, so it must not end with the
		// first one's context; the context's values (trace spans) are kept.
		b.exec(context.WithoutCancel(batch[0].ctx), batch)
		for _, c := range batch {
			if !c.state.CompareAndSwap(callSent, callDone) && c.err == nil && b.abandoned != nil {
				go b.abandoned(c)
			}
			close(c.done)
		}
	}
}

// takeLocked takes from the queue the first waiting call and, up to
// maxBatch, the waiting calls that fit with it, skipping the calls
// abandoned while queued. Calls that do not fit keep their place for a
// later batch.
func (b *batcher) takeLocked() []*call {
	var batch []*call
	kept := b.queue[:0]
	for _, q := range b.queue {
		switch {
		case len(batch) < b.maxBatch && (len(batch) == 0 || b.fits(batch[0], q)) &&
			q.state.CompareAndSwap(callQueued, callSent):
			if batch == nil {
				batch = make([]*call, 0, min(len(b.queue), b.maxBatch))
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

// newBatchers sets up the store's claim and completion batchers.
func (s *Store) newBatchers(maxBatch int) {
	s.claims = &batcher{s: s, op: "claim", maxBatch: maxBatch, exec: s.execClaims,
		fits:      func(first, c *call) bool { return c.lease.ms == first.lease.ms },
		abandoned: s.releaseAbandoned}
	s.completes = &batcher{s: s, op: "complete", maxBatch: maxBatch, exec: s.execCompletes,
		fits: func(_, _ *call) bool { return true }}
}

// releaseAbandoned releases the lease of a claim whose caller stopped
// waiting while the claim was in flight, so that the key does not stay in
// progress until the lease expires. If the release fails, the lease
// expires as usual.
func (s *Store) releaseAbandoned(c *call) {
	if c.claim.Outcome != idem.Acquired {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.ctx), releaseAbandonedTimeout)
	defer cancel()
	_ = s.releaseKey(ctx, c.key, c.claim.Token)
}

// execCompletes runs the completion script once for calls and sets each
// call's error.
func (s *Store) execCompletes(ctx context.Context, calls []*call) {
	e := completeExec(calls)
	_ = s.setCompletes(calls, completeLua.Exec(ctx, s.client, e.Keys, e.Args))
}

// completeExec returns the completion script's keys and arguments for
// calls.
func completeExec(calls []*call) rueidis.LuaExec {
	keys := make([]string, len(calls))
	args := make([]string, 0, 4*len(calls))
	for i, c := range calls {
		keys[i] = c.key
		args = append(args, c.tokenText, c.result, c.flags, c.retention)
	}
	return rueidis.LuaExec{Keys: keys, Args: args}
}

// setCompletes decodes the completion script's reply for calls (1 when all
// were completed, else one item per call) and sets each call's error. It returns the error of the call as a whole, if it
// failed (then every call has it).
func (s *Store) setCompletes(calls []*call, reply rueidis.RedisResult) error {
	if n, err := reply.AsInt64(); err == nil {
		// Every record was completed.
		if n != 1 {
			return failAll(calls, s.wrap("complete", fmt.Errorf("unknown reply %d", n)))
		}
		for _, c := range calls {
			c.err = nil
		}
		return nil
	}
	vals, err := reply.ToArray()
	if err == nil && len(vals) != len(calls) {
		err = fmt.Errorf("reply has %d elements, want %d", len(vals), len(calls))
	}
	if err != nil {
		return failAll(calls, s.wrap("complete", err))
	}
	for i, c := range calls {
		if ierr := vals[i].Error(); ierr != nil {
			c.err = s.wrap("complete", ierr)
			continue
		}
		n, ierr := vals[i].AsInt64()
		c.err = s.tokenReply("complete", c.key, c.token, n, ierr)
	}
	return nil
}

// failAll gives every call of a failed script call its error, and returns
// it.
func failAll(calls []*call, err error) error {
	for _, c := range calls {
		c.err = err
	}
	return err
}

// execMulti sends calls as script calls of up to the store's batch size,
// consecutive calls that fit together sharing one, all in one round trip
// from the caller's goroutine, and sets each call's outcome. It returns the
// first error of a script call as a whole.
func (s *Store) execMulti(ctx context.Context, script *rueidis.Lua, calls []*call, fits func(first, c *call) bool,
	build func([]*call) rueidis.LuaExec, set func([]*call, rueidis.RedisResult) error) error {
	if len(calls) == 0 {
		return nil
	}
	per := 1
	if s.claims != nil {
		per = s.claims.maxBatch
	}
	var chunks [][]*call
	for _, c := range calls {
		if n := len(chunks); n > 0 && len(chunks[n-1]) < per && fits(chunks[n-1][0], c) {
			chunks[n-1] = append(chunks[n-1], c)
			continue
		}
		chunks = append(chunks, []*call{c})
	}
	execs := make([]rueidis.LuaExec, len(chunks))
	for i, chunk := range chunks {
		execs[i] = build(chunk)
	}
	var first error
	for i, reply := range script.ExecMulti(ctx, s.client, execs...) {
		if err := set(chunks[i], reply); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// execClaims runs the claim script once for calls, which share a lease, and
// sets each call's claim or error.
func (s *Store) execClaims(ctx context.Context, calls []*call) {
	e := claimExec(s, calls)
	_ = s.setClaims(calls, claimLua.Exec(ctx, s.client, e.Keys, e.Args))
}

// claimExec returns the claim script's keys and arguments for calls, which
// share a lease.
func claimExec(s *Store, calls []*call) rueidis.LuaExec {
	keys := make([]string, len(calls))
	args := make([]string, 2, 2+len(calls))
	args[0], args[1] = s.abandonMS, calls[0].lease.s
	for i, c := range calls {
		keys[i] = c.key
		args = append(args, c.id)
	}
	return rueidis.LuaExec{Keys: keys, Args: args}
}

// setClaims decodes the claim script's reply for calls (the token alone
// when every claim was fresh, else the token, the time and one item per
// call) and sets each call's claim or error. It returns the error of the call as a whole, if it failed
// (then every call has it).
func (s *Store) setClaims(calls []*call, reply rueidis.RedisResult) error {
	if token, err := reply.AsInt64(); err == nil {
		// Every item was a fresh claim with this token.
		if token <= 0 {
			return failAll(calls, s.wrap("claim", fmt.Errorf("unknown reply %d", token)))
		}
		for _, c := range calls {
			c.claim, c.err = freshClaim(c, token, token/1000), nil
		}
		return nil
	}
	vals, err := reply.ToArray()
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
	if err != nil {
		return failAll(calls, s.wrap("claim", err))
	}
	for i, c := range calls {
		c.claim, c.err = s.decodeClaim(c, token, now, &vals[i+2])
	}
	return nil
}

// decodeClaim decodes one item of the claim script's reply.
func (s *Store) decodeClaim(c *call, token, now int64, item *rueidis.RedisMessage) (idem.Claim, error) {
	if item.IsInt64() {
		if n, _ := item.AsInt64(); n != 1 {
			return idem.Claim{}, fmt.Errorf("idemredis: claim: unknown item %d", n)
		}
		return freshClaim(c, token, now), nil
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
	switch outcome := claimOutcome(code); outcome {
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
	case "":
		if code != 0 {
			break
		}
		return idem.Claim{}, fmt.Errorf("idemredis: claim: key %s: %w", c.key, ErrRecordFormat)
	}
	return idem.Claim{}, fmt.Errorf("idemredis: claim: unknown outcome %d", code)
}

// freshClaim is the claim of c acquired by SET NX with token at now (ms).
func freshClaim(c *call, token, now int64) idem.Claim {
	return idem.Claim{Outcome: idem.Acquired, Token: token, LeaseExpiresAt: time.UnixMilli(now + c.lease.ms)}
}

// claimOutcome maps the claim script's result codes (1 acquired, 2 in
// progress, 3 completed, 4 mismatch; 0 an unreadable record) to outcomes.
func claimOutcome(code int64) idem.Outcome {
	switch code {
	case 1:
		return idem.Acquired
	case 2:
		return idem.InProgress
	case 3:
		return idem.Completed
	case 4:
		return idem.Mismatch
	}
	return ""
}
