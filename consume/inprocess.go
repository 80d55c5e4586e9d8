package consume

import (
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/retry"
)

// InProcess is implemented by a [Delivery] that its broker cannot redeliver
// on its own: a Kafka record, whose offset commit settles every record
// before it. The engine then retries such a delivery in process, where
// [Engine.Handle] and [Engine.HandleBatch] would leave it to the broker:
// after a failed attempt it calls Retry (or Requeue), which only records
// the new State and must not redeliver anything, waits the decided delay
// and handles the delivery again, until it is acked or dead-lettered or
// ctx ends (idem.Abandoned). A failure to settle (a dead letter the broker
// did not take) is retried the same way after the policy's backoff. Every
// attempt is one delivery for the hooks; HandleBatch settles a failed
// batch's deliveries one after the other, in order.
type InProcess interface {
	Delivery
	// InProcess marks the delivery; the engine does not call it.
	InProcess()
}

// again retries t in process (see [InProcess]) after the attempt that
// ended with out and err.
func (e *Engine) again(t *begun, out idem.Outcome, err error) (idem.Outcome, error) {
	for failures := 0; ; {
		var wait time.Duration
		switch {
		case err != nil:
			wait = e.policy.Delay(failures)
			failures++
		case out == idem.Retried:
			wait = t.ev.Delay
		case out == idem.Requeued:
			// The engine waited before requeueing.
		default:
			return out, nil
		}
		if retry.Sleep(t.outer, wait) != nil {
			return idem.Abandoned, nil
		}
		t = e.begin(t.outer, t.d)
		out, err = e.attempt(t)
	}
}

// attempt handles and settles t once and ends it, also when something
// panics.
func (e *Engine) attempt(t *begun) (idem.Outcome, error) {
	defer e.endPanicked(t)
	out, err := e.handle(t.ctx, t.d, t.st, t.reason, &t.ev)
	e.end(t, out, err)
	return out, err
}
