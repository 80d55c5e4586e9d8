package idemamqp

import (
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Topology names the queues and exchange a consumer uses. Only Queue is
// required; the others default to names derived from it.
type Topology struct {
	// Queue is the work queue.
	Queue string
	// RetryQueue holds failed messages until their delay expires; default
	// Queue+".retry".
	RetryQueue string
	// DeadLetterExchange is the work queue's x-dead-letter-exchange;
	// default Queue+".dlx".
	DeadLetterExchange string
	// DeadLetterQueue receives dead letters; default Queue+".dlq". It is
	// bound to DeadLetterExchange with its own name as the routing key.
	DeadLetterQueue string
}

// WithDefaults returns t with the derived names filled in.
func (t Topology) WithDefaults() Topology {
	if t.RetryQueue == "" {
		t.RetryQueue = t.Queue + ".retry"
	}
	if t.DeadLetterExchange == "" {
		t.DeadLetterExchange = t.Queue + ".dlx"
	}
	if t.DeadLetterQueue == "" {
		t.DeadLetterQueue = t.Queue + ".dlq"
	}
	return t
}

func (t Topology) validate() error {
	if t.Queue == "" {
		return fmt.Errorf("idemamqp: topology needs a queue name")
	}
	for _, n := range []string{t.Queue, t.RetryQueue, t.DeadLetterExchange, t.DeadLetterQueue} {
		if len(n) > 255 {
			return fmt.Errorf("idemamqp: name %.40q… is longer than 255 bytes", n)
		}
	}
	return nil
}

// Declare declares t's exchange and queues, durable, on ch. It is
// idempotent, and fails if a queue exists with different arguments.
func Declare(ch *amqp.Channel, t Topology) error {
	t = t.WithDefaults()
	if err := t.validate(); err != nil {
		return err
	}
	if err := ch.ExchangeDeclare(t.DeadLetterExchange, amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
		return fmt.Errorf("idemamqp: declare exchange %q: %w", t.DeadLetterExchange, err)
	}
	if _, err := ch.QueueDeclare(t.DeadLetterQueue, true, false, false, false, nil); err != nil {
		return fmt.Errorf("idemamqp: declare queue %q: %w", t.DeadLetterQueue, err)
	}
	if err := ch.QueueBind(t.DeadLetterQueue, t.DeadLetterQueue, t.DeadLetterExchange, false, nil); err != nil {
		return fmt.Errorf("idemamqp: bind %q to %q: %w", t.DeadLetterQueue, t.DeadLetterExchange, err)
	}
	if _, err := ch.QueueDeclare(t.Queue, true, false, false, false, amqp.Table{
		"x-dead-letter-exchange":    t.DeadLetterExchange,
		"x-dead-letter-routing-key": t.DeadLetterQueue,
	}); err != nil {
		return fmt.Errorf("idemamqp: declare queue %q: %w", t.Queue, err)
	}
	// Expired retries dead-letter through the default exchange straight
	// back to the work queue.
	if _, err := ch.QueueDeclare(t.RetryQueue, true, false, false, false, amqp.Table{
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": t.Queue,
	}); err != nil {
		return fmt.Errorf("idemamqp: declare queue %q: %w", t.RetryQueue, err)
	}
	return nil
}

// Delete removes t's queues and exchange (tests and teardown).
func Delete(ch *amqp.Channel, t Topology) error {
	t = t.WithDefaults()
	var first error
	for _, q := range []string{t.Queue, t.RetryQueue, t.DeadLetterQueue} {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil && first == nil {
			first = fmt.Errorf("idemamqp: delete queue %q: %w", q, err)
		}
	}
	if err := ch.ExchangeDelete(t.DeadLetterExchange, false, false); err != nil && first == nil {
		first = fmt.Errorf("idemamqp: delete exchange %q: %w", t.DeadLetterExchange, err)
	}
	return first
}
