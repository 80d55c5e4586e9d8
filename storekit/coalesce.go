package storekit

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
)

// The states of a Pending call. A waiter whose context ends takes a queued
// call out of the queue (callQueued to callAbandoned) or leaves a sent
// call to its sender (callSent to callAbandoned), which may then undo work
// nobody is waiting for (Coalescer.Abandoned).
const (
	callQueued int32 = iota
	callSent
	callDone
	callAbandoned
)

// Pending is the part of a store's call that a [Coalescer] keeps: embed it
// in the call type. Err is the call's outcome, set by the Coalescer's Exec.
type Pending struct {
	ctx   context.Context
	state atomic.Int32
	done  chan struct{} // closed when the outcome is set
	Err   error
}

// Context returns the context the call was made with (its values, such as
// trace spans; it may have ended by the time Exec or Abandoned runs).
func (p *Pending) Context() context.Context { return p.ctx }

func (p *Pending) pending() *Pending { return p }

// Call is a store's call type with a [Pending] embedded.
type Call interface{ pending() *Pending }

// Fail gives every call of a failed store call err, and returns it.
func Fail[C Call](calls []C, err error) error {
	for _, c := range calls {
		c.pending().Err = err
	}
	return err
}

// GroupContext returns the context for the store call that carries calls,
// with the values of ctx (Exec's). A group's store call must not end with
// any one caller's context, nor outlive them all: it ends once every
// caller's context has ended (the last of their deadlines, or
// cancellations), so that a server that stops answering, or a statement
// waiting on a row lock, cannot hold a connection for callers that have
// all gone, while the store call goes on as long as one of them waits. A
// lone call's context ends, in effect, with its own. Call the returned
// function when the store call is done.
func GroupContext[C Call](ctx context.Context, calls []C) (context.Context, context.CancelFunc) {
	if len(calls) == 1 && calls[0].pending().ctx == ctx {
		// A lone call sent with its own context, as Coalescer does.
		return ctx, func() {}
	}
	gctx, cancel := context.WithCancelCause(ctx)
	var left atomic.Int64
	left.Store(int64(len(calls)))
	stops := make([]func() bool, len(calls))
	for i, c := range calls {
		cctx := c.pending().ctx
		stops[i] = context.AfterFunc(cctx, func() {
			if left.Add(-1) == 0 {
				cancel(context.Cause(cctx))
			}
		})
	}
	return gctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel(nil)
	}
}

// Coalescer gathers the calls of one kind that arrive while earlier ones
// are in flight and sends them as one store call: its fixed cost (a
// statement or a script call, a round trip, a commit, the system calls) is
// paid once per group instead of once per call. Exec decides how each call
// is handled; idemredis and idempgx keep each key's own handling atomic.
//
// There is no timer. A call that finds nothing queued and fewer than
// InFlight store calls in flight is sent alone, at once, from its caller's
// goroutine, as without coalescing: a store with few callers pays no
// hand-off. A call that finds others waiting, or the store calls in
// flight, queues; when fewer than InFlight are in flight it starts a
// sender (so does a lone call that returns to a non-empty queue), which
// sends up to MaxBatch queued calls at once and keeps sending what queued
// meanwhile until the queue is empty. A sender is a goroutine of its own,
// so that every queued caller can stop waiting when its context ends while
// the store call that carries its work, and others', goes on.
//
// Set the exported fields before the first Do and leave them.
type Coalescer[C Call] struct {
	// MaxBatch bounds the calls of one store call; InFlight the store calls
	// in flight at once (at least 1).
	MaxBatch, InFlight int
	// Exec makes one store call for calls and sets each one's Err (and its
	// other outcomes). ctx is the call's own context for a lone call; for
	// a group it keeps the first call's values but does not end with it,
	// so Exec bounds it if the store call could hang.
	Exec func(ctx context.Context, calls []C)
	// Fits, if set, reports whether c can join a store call that starts
	// with first; a call that does not fit waits for a later one.
	Fits func(first, c C) bool
	// Weight, if set, weighs a call (the bytes it sends, say); a group
	// takes no call that would bring its weight over MaxWeight, except its
	// first.
	Weight    func(c C) int
	MaxWeight int
	// Abandoned, if set, is called (on a goroutine of its own) for a call
	// that succeeded after its caller stopped waiting.
	Abandoned func(c C)
	// Wrap, if set, wraps the error Do returns when the caller's context
	// ends first.
	Wrap func(error) error

	mu       sync.Mutex
	queue    []C
	inFlight int // store calls being sent: lone calls and senders, at most InFlight
}

// Do sends c alone when nothing is waiting, or else queues it and waits for
// its outcome; it returns c's Err, or the context's cause (wrapped) once
// ctx ends first.
func (b *Coalescer[C]) Do(ctx context.Context, c C) error {
	if err := context.Cause(ctx); err != nil {
		return b.wrap(err)
	}
	p := c.pending()
	p.ctx = ctx
	b.mu.Lock()
	if b.inFlight < max(b.InFlight, 1) && len(b.queue) == 0 {
		// Nothing is waiting: send c alone, from the caller's goroutine.
		b.inFlight++
		b.mu.Unlock()
		b.lone(ctx, c)
		return p.Err
	}
	p.done = make(chan struct{})
	b.queue = append(b.queue, c)
	start := b.inFlight < max(b.InFlight, 1)
	if start {
		b.inFlight++
	}
	b.mu.Unlock()
	if start {
		go b.send()
	}
	return b.await(ctx, p)
}

// await waits for the outcome of p, queued or sent, or for ctx to end first.
func (b *Coalescer[C]) await(ctx context.Context, p *Pending) error {
	select {
	case <-p.done:
	case <-ctx.Done():
		if p.state.CompareAndSwap(callQueued, callAbandoned) || p.state.CompareAndSwap(callSent, callAbandoned) {
			return b.wrap(context.Cause(ctx))
		}
		<-p.done // the outcome arrived as ctx ended: report it
	}
	if ctx.Err() != nil && (errors.Is(p.Err, context.Canceled) || errors.Is(p.Err, context.DeadlineExceeded)) {
		// The group's store call ended because every caller's context had
		// (see GroupContext), and its outcome came back before this caller
		// saw its own context end (a busy machine may run the sender first):
		// the reason is this caller's.
		return b.wrap(context.Cause(ctx))
	}
	return p.Err
}

// Queued returns how many calls wait for a store call now.
func (b *Coalescer[C]) Queued() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue)
}

// lone makes the store call of a lone call, then hands its slot to the
// calls that queued meanwhile, or gives it back; also when Exec panics (the
// panic goes on to the caller, which may recover, as net/http does, and a
// slot kept would leave later calls queued with no sender).
func (b *Coalescer[C]) lone(ctx context.Context, c C) {
	defer func() {
		b.mu.Lock()
		start := len(b.queue) > 0 // arrived meanwhile: this slot sends them
		if !start {
			b.inFlight--
		}
		b.mu.Unlock()
		if start {
			go b.send()
		}
	}()
	b.Exec(ctx, []C{c})
}

func (b *Coalescer[C]) wrap(err error) error {
	if b.Wrap != nil {
		return b.Wrap(err)
	}
	return err
}

// send sends groups until the queue is empty.
func (b *Coalescer[C]) send() {
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
		b.Exec(context.WithoutCancel(batch[0].pending().ctx), batch)
		for _, c := range batch {
			p := c.pending()
			if !p.state.CompareAndSwap(callSent, callDone) && p.Err == nil && b.Abandoned != nil {
				go b.Abandoned(c)
			}
			close(p.done)
		}
	}
}

// takeLocked takes from the queue the first waiting call and, up to
// MaxBatch and MaxWeight, the waiting calls that fit with it, skipping the
// calls abandoned while queued. Calls that do not fit keep their place for a
// later group.
func (b *Coalescer[C]) takeLocked() []C {
	var batch []C
	weight := 0
	kept := b.queue[:0]
	for _, q := range b.queue {
		p := q.pending()
		w := 0
		if b.Weight != nil {
			w = b.Weight(q)
		}
		switch {
		case len(batch) < max(b.MaxBatch, 1) &&
			(len(batch) == 0 || (b.Fits == nil || b.Fits(batch[0], q)) && (b.Weight == nil || weight+w <= b.MaxWeight)) &&
			p.state.CompareAndSwap(callQueued, callSent):
			if batch == nil {
				batch = make([]C, 0, min(len(b.queue), max(b.MaxBatch, 1)))
			}
			batch = append(batch, q)
			weight += w
		case p.state.Load() == callQueued:
			kept = append(kept, q)
		}
	}
	clear(b.queue[len(kept):])
	b.queue = kept
	return batch
}
