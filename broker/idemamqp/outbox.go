package idemamqp

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/outbox"
	amqp "github.com/rabbitmq/amqp091-go"
)

// OutboxConfig configures an [OutboxPublisher].
type OutboxConfig struct {
	// Exchange is where every message is published, with Message.Topic as
	// the routing key. Empty: the default exchange, so that Topic names
	// the queue.
	Exchange string
	// ConfirmTimeout bounds how long one Publish waits for the broker's
	// confirms; a message not confirmed by then gets a retryable error
	// (the relay publishes it again, under the same message_id). Default
	// 30s.
	ConfirmTimeout time.Duration
}

// OutboxPublisher is the outbox relay's [outbox.Publisher] for RabbitMQ.
// Each message is published persistent and mandatory on a channel in
// confirm mode, with message_id = Message.ID, the routing key
// Message.Topic, timestamp = Message.CreatedAt and Message.Headers as AMQP
// headers; it is confirmed only by the broker's ack (publisher confirms).
// A batch is published back to back and then every confirm is awaited, so
// a batch costs about one round trip.
//
// A message the broker returns as unroutable (no queue bound for its
// routing key: mandatory) gets an [outbox.PermanentError], so the relay
// moves the event to the dead state instead of losing it. A nack and a
// lost connection or channel are retryable (idem.Retryable): the next
// Publish dials again. RabbitMQ has no broker-side dedupe; idem's
// consumers remove the relay's duplicates by message_id.
//
// Publish calls are serialised over one channel; it is safe for concurrent
// use. Close it when done.
type OutboxPublisher struct {
	dial DialFunc
	cfg  OutboxConfig

	mu      sync.Mutex
	conn    *amqp.Connection
	ch      *amqp.Channel
	returns chan amqp.Return
	closed  bool
}

var _ outbox.Publisher = (*OutboxPublisher)(nil)

// NewOutboxPublisher returns an OutboxPublisher that connects with dial on
// its first Publish (cfg may be nil).
func NewOutboxPublisher(dial DialFunc, cfg *OutboxConfig) (*OutboxPublisher, error) {
	if dial == nil {
		return nil, fmt.Errorf("%w: idemamqp: NewOutboxPublisher needs a DialFunc", idem.ErrInvalidConfig)
	}
	p := &OutboxPublisher{dial: dial}
	if cfg != nil {
		p.cfg = *cfg
	}
	if p.cfg.ConfirmTimeout < 0 {
		return nil, fmt.Errorf("%w: idemamqp: OutboxConfig.ConfirmTimeout %v is negative", idem.ErrInvalidConfig, p.cfg.ConfirmTimeout)
	}
	if p.cfg.ConfirmTimeout == 0 {
		p.cfg.ConfirmTimeout = 30 * time.Second
	}
	return p, nil
}

// Close closes the publisher's connection. Publish fails after it.
func (p *OutboxPublisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	return p.reset()
}

// reset drops the connection; the next Publish dials again.
func (p *OutboxPublisher) reset() error {
	var err error
	if p.conn != nil {
		if !p.conn.IsClosed() {
			// A connection whose peer vanished never answers close-ok.
			err = p.conn.CloseDeadline(time.Now().Add(5 * time.Second))
		}
		p.conn, p.ch, p.returns = nil, nil, nil
	}
	return err
}

// channel returns the confirm-mode channel, dialing when there is none.
func (p *OutboxPublisher) channel(ctx context.Context) (*amqp.Channel, error) {
	if p.closed {
		return nil, errors.New("idemamqp: outbox publisher is closed")
	}
	if p.ch != nil && !p.ch.IsClosed() {
		return p.ch, nil
	}
	_ = p.reset()
	conn, err := p.dial(ctx)
	if err != nil {
		return nil, idem.Retryable(fmt.Errorf("idemamqp: outbox publisher: dial: %w", err))
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		_ = conn.Close()
		return nil, idem.Retryable(fmt.Errorf("idemamqp: outbox publisher: open a confirm channel: %w", err))
	}
	// Returns arrive before the confirm of the same message, on the
	// connection's reader goroutine; the buffer holds a whole batch's, so
	// the reader never waits for Publish to read them.
	p.returns = ch.NotifyReturn(make(chan amqp.Return, outbox.MaxBatch+1))
	p.conn, p.ch = conn, ch
	return ch, nil
}

// Publish publishes msgs and waits for their confirms; it returns one
// error per message (nil: the broker confirmed it and routed it).
func (p *OutboxPublisher) Publish(ctx context.Context, msgs []outbox.Message) []error {
	errs := make([]error, len(msgs))
	fail := func(from int, err error) []error {
		for i := from; i < len(msgs); i++ {
			if errs[i] == nil {
				errs[i] = err
			}
		}
		return errs
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.ConfirmTimeout)
	defer cancel()
	p.mu.Lock()
	defer p.mu.Unlock()
	ch, err := p.channel(ctx)
	if err != nil {
		return fail(0, err)
	}
	confirms := make([]*amqp.DeferredConfirmation, len(msgs))
	for i, m := range msgs {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, p.cfg.Exchange, m.Topic, true, false, publishing(m))
		if err != nil {
			_ = p.reset()
			return fail(i, idem.Retryable(fmt.Errorf("idemamqp: outbox publish %q: %w", m.ID, err)))
		}
		confirms[i] = dc
	}
	lost := false
	for i, dc := range confirms {
		if errs[i] != nil {
			continue
		}
		ok, err := dc.WaitContext(ctx)
		switch {
		case err != nil:
			lost = true
			errs[i] = idem.Retryable(fmt.Errorf("idemamqp: outbox publish %q: no confirm: %w", msgs[i].ID, err))
		case !ok:
			errs[i] = idem.Retryable(fmt.Errorf("idemamqp: outbox publish %q: nacked by the broker", msgs[i].ID))
		}
	}
	if lost {
		// A missing confirm leaves the channel's sequence unknown: start
		// over on a new one.
		_ = p.reset()
		return errs
	}
	returned := map[string]amqp.Return{}
	for drained := false; !drained; {
		select {
		case r, ok := <-p.returns:
			if !ok { // the channel closed: nothing more can come
				drained = true
				break
			}
			returned[r.MessageId] = r
		default:
			drained = true
		}
	}
	for i, m := range msgs {
		if r, ok := returned[m.ID]; ok && errs[i] == nil {
			errs[i] = outbox.PermanentError(fmt.Errorf("idemamqp: outbox publish %q: returned unroutable by exchange %q for routing key %q: %d %s",
				m.ID, r.Exchange, r.RoutingKey, r.ReplyCode, r.ReplyText))
		}
	}
	return errs
}

// publishing is the AMQP message of an outbox message.
func publishing(m outbox.Message) amqp.Publishing {
	var h amqp.Table
	if len(m.Headers) > 0 {
		h = make(amqp.Table, len(m.Headers))
		for k, v := range m.Headers {
			h[k] = v
		}
	}
	return amqp.Publishing{MessageId: m.ID, Body: m.Payload, Headers: h, DeliveryMode: amqp.Persistent,
		Timestamp: m.CreatedAt, ContentType: m.Headers["content-type"]}
}
