package consume

import (
	"context"
	"errors"
	"fmt"

	"github.com/idem-go/idem"
)

// BatchProcessFunc runs the user's handler once for a batch: msgs[i]
// belongs to ds[i]. It records every message's dedupe record and the
// effects of the fresh ones in one transaction (a closure over a SQL
// store's ProcessBatch), and returns one outcome per message:
// idem.Processed, idem.Duplicate or idem.Mismatch. An error means nothing
// was recorded.
type BatchProcessFunc func(ctx context.Context, msgs []idem.Message, ds []Delivery) ([]idem.Outcome, error)

// HandleBatch processes deliveries with one call to process: one dedupe
// round trip and one transaction for all of them, which is where batch
// throughput comes from. Deliveries without a usable key are dead-lettered
// on their own. When the batch fails as a whole, every delivery is handled
// again one by one, as [Engine.Handle] does, so that one bad message gets
// its own retries and dead letter without holding back the others. It
// returns the outcome of each delivery and the first settle error.
//
// The hooks see each delivery as Handle does: its start hooks are called
// before the batch runs and each delivery is settled with the context they
// returned; its end hooks are called once. process serves many deliveries,
// so it runs with ctx itself.
func (e *Engine) HandleBatch(ctx context.Context, ds []Delivery, process BatchProcessFunc) ([]idem.Outcome, error) {
	outs := make([]idem.Outcome, len(ds))
	ts := make([]*begun, len(ds))
	defer e.endPanicked(ts...)
	var firstErr error
	keep := func(i int, out idem.Outcome, err error) {
		outs[i] = out
		if err != nil && firstErr == nil {
			firstErr = err
		}
	}
	one := func(i int) {
		out, err := e.handleBegun(ts[i])
		keep(i, out, err)
	}
	msgs := make([]idem.Message, 0, len(ds))
	idx := make([]int, 0, len(ds))
	batch := make([]Delivery, 0, len(ds))
	for i, d := range ds {
		ts[i] = e.begin(ctx, d)
		if ts[i].reason != "" {
			one(i) // dead-letters it with its reason
			continue
		}
		msgs = append(msgs, idem.Message{Scope: e.cfg.Name, Key: ts[i].ev.Key, Fingerprint: e.cfg.Fingerprint(d), Retention: e.cfg.Retention})
		idx = append(idx, i)
		batch = append(batch, d)
	}
	if len(batch) == 0 {
		return outs, firstErr
	}
	results, err := e.runBatch(ctx, msgs, batch, process)
	if err == nil && len(results) != len(batch) {
		err = fmt.Errorf("consume: batch process returned %d results for %d messages", len(results), len(batch))
	}
	if err != nil {
		if ctx.Err() != nil {
			for _, i := range idx {
				ts[i].ev.Err = err
				e.end(ts[i], idem.Abandoned, nil)
				keep(i, idem.Abandoned, nil)
			}
			return outs, firstErr
		}
		e.cfg.Logger.Debug("idem: batch failed; handling its messages one by one", "consumer", e.cfg.Name, "size", len(batch), "err", err)
		for _, i := range idx {
			one(i)
		}
		return outs, firstErr
	}
	for j, i := range idx {
		t := ts[i]
		var out idem.Outcome
		var serr error
		switch results[j] {
		case idem.Processed, idem.Duplicate:
			out = results[j]
			serr = wrapSettle("ack", t.d.Ack(t.ctx))
		case idem.Mismatch:
			t.ev.Reason = idem.DeadMismatch
			out, serr = e.deadLetter(t.ctx, t.d, t.st, idem.DeadMismatch,
				fmt.Errorf("%w (scope %q, key %q)", idem.ErrFingerprintMismatch, msgs[j].Scope, msgs[j].Key))
		default:
			one(i)
			continue
		}
		e.end(t, out, serr)
		keep(i, out, serr)
	}
	return outs, firstErr
}

func (e *Engine) runBatch(ctx context.Context, msgs []idem.Message, ds []Delivery, process BatchProcessFunc) (res []idem.Outcome, err error) {
	defer func() {
		if p := recover(); p != nil {
			res, err = nil, errors.New("consume: batch handler panicked")
			e.cfg.Logger.Error("idem: batch handler panicked", "consumer", e.cfg.Name, "panic", p)
		}
	}()
	return process(ctx, msgs, ds)
}
