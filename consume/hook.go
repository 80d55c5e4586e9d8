package consume

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
)

// Event describes one delivery. A start hook sees Consumer, ID, Key and
// Attempt; an end hook sees the rest too.
type Event struct {
	Consumer string
	// ID is the message id as delivered ("" when missing); Key is the
	// dedupe key used ("" when none could be derived).
	ID, Key string
	// Attempt is this delivery's attempt number, from 1.
	Attempt int
	// Outcome is what the engine did with the delivery (see [Engine.Handle]).
	Outcome idem.Outcome
	// Reason is the dead-letter reason, when Outcome is idem.DeadLettered.
	Reason idem.DeadReason
	// Infrastructure is set when a retry does not count toward MaxAttempts.
	Infrastructure bool
	// Delay is the retry delay, when Outcome is idem.Retried.
	Delay time.Duration
	// Err is the handler's or the broker's error, if any.
	Err error
	// Duration is how long handling the delivery took, from the end of its
	// start hooks.
	Duration time.Duration
}

// DeliveryStartHook is called when the engine starts handling a delivery,
// with Consumer, ID, Key and Attempt set. The context it returns is the one
// the delivery is handled (and the handler runs) with.
type DeliveryStartHook interface {
	OnDeliveryStart(ctx context.Context, ev Event) context.Context
}

// DeliveryEndHook is called once per handled delivery, with its outcome
// and the context the start hooks returned (also when something panicked:
// outcome idem.Panicked, before the panic goes on).
type DeliveryEndHook interface {
	OnDeliveryEnd(ctx context.Context, ev Event)
}

// Counters is a [DeliveryEndHook] that counts outcomes. The zero value is
// ready: Hooks: []idem.Hook{&counters}.
type Counters struct {
	processed, duplicate, retried, infraRetried, deadLettered, requeued, abandoned atomic.Int64
}

// OnDeliveryEnd counts ev.
func (c *Counters) OnDeliveryEnd(_ context.Context, ev Event) {
	switch ev.Outcome {
	case idem.Processed:
		c.processed.Add(1)
	case idem.Duplicate:
		c.duplicate.Add(1)
	case idem.Retried:
		c.retried.Add(1)
		if ev.Infrastructure {
			c.infraRetried.Add(1)
		}
	case idem.DeadLettered:
		c.deadLettered.Add(1)
	case idem.Requeued:
		c.requeued.Add(1)
	case idem.Abandoned:
		c.abandoned.Add(1)
	}
}

// Snapshot is a copy of the counts.
type Snapshot struct {
	Processed, Duplicate, Retried, InfraRetried, DeadLettered, Requeued, Abandoned int64
}

// Snapshot returns the current counts.
func (c *Counters) Snapshot() Snapshot {
	return Snapshot{
		Processed: c.processed.Load(), Duplicate: c.duplicate.Load(), Retried: c.retried.Load(),
		InfraRetried: c.infraRetried.Load(), DeadLettered: c.deadLettered.Load(),
		Requeued: c.requeued.Load(), Abandoned: c.abandoned.Load(),
	}
}
