package outbox

import (
	"context"
	"errors"
	"time"
)

// Message is one outbox event as the relay hands it to a [Publisher].
//
// ID is stable: the same event always goes out with the same ID, however
// often the relay retries it or crashes between publishing and marking it
// sent. Publishers put it where the broker's own dedupe and idem's
// consumers read it (AMQP message_id, Nats-Msg-Id, the Kafka "idem-id"
// header, the SQS FIFO MessageDeduplicationId and the idem id attribute),
// so the relay's own duplicates are removed downstream.
type Message struct {
	// ID is the event's id (unique per outbox), 1–255 bytes of printable
	// ASCII.
	ID string
	// Topic is where the event goes: an AMQP routing key (with the
	// exchange fixed by the publisher), a NATS subject, a Kafka topic or
	// an SQS queue URL, as the publisher documents.
	Topic string
	// Key orders events: the relay keeps at most one event per Key in
	// flight when ordering is on. Publishers map it to the broker's
	// partitioning (Kafka record key, SQS MessageGroupId). Empty: none.
	Key string
	// Payload is the event body.
	Payload []byte
	// Headers are extra headers or attributes (never interpreted by the
	// relay).
	Headers map[string]string
	// Attempt is 1 on the first publish of this event, 2 on the next.
	Attempt int
	// CreatedAt is when the producer's transaction wrote the event.
	CreatedAt time.Time
}

// Publisher sends a batch of outbox messages to a broker and reports, per
// message, whether the broker confirmed it (publisher confirms on
// RabbitMQ, the PubAck on JetStream, the produce response on Kafka, the
// SendMessage answer on SQS).
//
// Publish returns one error per message, in the order of msgs (a nil
// slice, or a nil entry, means confirmed). The relay marks an event sent
// only when its entry is nil. An entry for which [Permanent] reports true
// (the broker refused this message for good: too large, no such topic)
// sends the event to the outbox's dead state at once; any other error is
// retried with backoff. Publish must not return before every message it
// reports as confirmed has been confirmed by the broker.
type Publisher interface {
	Publish(ctx context.Context, msgs []Message) []error
}

// PublisherFunc adapts a function to [Publisher].
type PublisherFunc func(ctx context.Context, msgs []Message) []error

// Publish calls f.
func (f PublisherFunc) Publish(ctx context.Context, msgs []Message) []error { return f(ctx, msgs) }

// permanent marks an error that retrying cannot fix.
type permanent struct{ err error }

func (p permanent) Error() string { return p.err.Error() }
func (p permanent) Unwrap() error { return p.err }

// PermanentError wraps err so that the relay dead-letters the event at
// once instead of retrying it. A nil err stays nil.
func PermanentError(err error) error {
	if err == nil {
		return nil
	}
	return permanent{err}
}

// Permanent reports whether err, or any error it wraps or joins, was
// marked with [PermanentError].
func Permanent(err error) bool {
	var p permanent
	return errors.As(err, &p)
}
