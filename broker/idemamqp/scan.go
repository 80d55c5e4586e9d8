package idemamqp

import (
	"context"
	"fmt"
	"iter"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ScanDeadLetters iterates over up to limit messages of the dead-letter
// queue (default 1000 when limit <= 0) without consuming them, like
// [ListDeadLetters], but holds none of them once the loop body has seen
// it: finding one message in a large queue does not load every body into
// memory. Messages are fetched unacknowledged on a channel of their own and
// go back to the queue when the iteration ends. A message whose
// DeadLetterID an earlier one of the scan carried (the same dead letter
// published again after a redelivery) comes with Repeat set. An error is
// yielded once, with a zero message, and ends the iteration.
func ScanDeadLetters(ctx context.Context, conn *amqp.Connection, queue string, limit int) iter.Seq2[DeadMessage, error] {
	if limit <= 0 {
		limit = 1000
	}
	return func(yield func(DeadMessage, error) bool) {
		ch, err := conn.Channel()
		if err != nil {
			yield(DeadMessage{}, fmt.Errorf("idemamqp: open channel: %w", err))
			return
		}
		defer ch.Close()
		seen := repeats{}
		for range limit {
			if err := ctx.Err(); err != nil {
				yield(DeadMessage{}, err)
				return
			}
			d, ok, err := ch.Get(queue, false)
			if err != nil {
				yield(DeadMessage{}, fmt.Errorf("idemamqp: read %q: %w", queue, err))
				return
			}
			if !ok {
				return
			}
			m := parseDeadMessage(d)
			m.Repeat = seen.see(m)
			if !yield(m, nil) {
				return
			}
		}
	}
}
