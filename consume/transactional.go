package consume

import (
	"context"

	"github.com/idem-go/idem"
)

// Transactional returns the [ProcessFunc] of the transactional path: handle
// runs in a transaction of p (an idem.Processor: idempgx.Store with pgx.Tx,
// idemsqlite.Store with *sql.Tx) that also records the message's dedupe
// record, so the effect and the record commit together or not at all. A
// message seen before does not run handle: Duplicate, or Mismatch for a
// different payload under the same id. An error from handle rolls the
// transaction back and is classified by the retry package's rules.
//
// It panics if p or handle is nil.
func Transactional[Tx any](p idem.Processor[Tx], handle func(ctx context.Context, tx Tx, d Delivery) error) ProcessFunc {
	if p == nil || handle == nil {
		panic("consume: Transactional needs a Processor and a handler")
	}
	return func(ctx context.Context, msg idem.Message, d Delivery) (idem.Outcome, error) {
		return p.Process(ctx, msg, func(ctx context.Context, tx Tx) error { return handle(ctx, tx, d) })
	}
}

// TransactionalBatch returns the [BatchProcessFunc] of the transactional
// path: handle runs once, in one transaction of p that also records every
// message's dedupe record, with the deliveries seen for the first time, in
// order (it does not run when there are none). An error from handle rolls
// the whole batch back; [Engine.HandleBatch] then handles its deliveries
// one by one.
//
// It panics if p or handle is nil.
func TransactionalBatch[Tx any](p idem.Processor[Tx], handle func(ctx context.Context, tx Tx, fresh []Delivery) error) BatchProcessFunc {
	if p == nil || handle == nil {
		panic("consume: TransactionalBatch needs a Processor and a handler")
	}
	return func(ctx context.Context, msgs []idem.Message, ds []Delivery) ([]idem.Outcome, error) {
		return p.ProcessBatch(ctx, msgs, func(ctx context.Context, tx Tx, fresh []int) error {
			fds := make([]Delivery, len(fresh))
			for i, j := range fresh {
				fds[i] = ds[j]
			}
			return handle(ctx, tx, fds)
		})
	}
}
