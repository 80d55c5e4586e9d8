package consume

import (
	"context"
	"errors"
	"fmt"
	"time"

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
// again one by one with [Engine.Handle], so that one bad message gets its
// own retries and dead letter without holding back the others. It returns
// the outcome of each delivery and the first settle error.
func (e *Engine) HandleBatch(ctx context.Context, ds []Delivery, process BatchProcessFunc) ([]idem.Outcome, error) {
	outs := make([]idem.Outcome, len(ds))
	var firstErr error
	keep := func(err error) {
		if err != nil && firstErr == nil {
			firstErr = err
		}
	}
	start := time.Now()
	msgs := make([]idem.Message, 0, len(ds))
	idx := make([]int, 0, len(ds))
	batch := make([]Delivery, 0, len(ds))
	for i, d := range ds {
		key, reason := e.Key(d)
		if reason != "" {
			out, err := e.Handle(ctx, d) // dead-letters it with its reason
			outs[i] = out
			keep(err)
			continue
		}
		msgs = append(msgs, idem.Message{Scope: e.cfg.Name, Key: key, Fingerprint: e.cfg.Fingerprint(d), Retention: e.cfg.Retention})
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
				outs[i] = idem.Abandoned
			}
			return outs, firstErr
		}
		e.cfg.Logger.Debug("idem: batch failed; handling its messages one by one", "consumer", e.cfg.Name, "size", len(batch), "err", err)
		for j, d := range batch {
			out, err := e.Handle(ctx, d)
			outs[idx[j]] = out
			keep(err)
		}
		return outs, firstErr
	}
	for j, d := range batch {
		st := d.State()
		ev := Event{Consumer: e.cfg.Name, ID: d.ID(), Key: msgs[j].Key, Attempt: st.Attempts + 1}
		var out idem.Outcome
		var serr error
		switch results[j] {
		case idem.Processed, idem.Duplicate:
			out = results[j]
			serr = wrapSettle("ack", d.Ack(ctx))
		case idem.Mismatch:
			ev.Reason = idem.DeadMismatch
			out, serr = e.deadLetter(ctx, d, st, idem.DeadMismatch,
				fmt.Errorf("%w (scope %q, key %q)", idem.ErrFingerprintMismatch, msgs[j].Scope, msgs[j].Key))
		default:
			out, serr = e.Handle(ctx, d)
			outs[idx[j]] = out
			keep(serr)
			continue
		}
		ev.Outcome, ev.Duration, ev.Err = out, time.Since(start), serr
		e.cfg.Hooks.OnDelivery(ctx, ev)
		outs[idx[j]] = out
		keep(serr)
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
