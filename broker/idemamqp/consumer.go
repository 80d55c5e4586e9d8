package idemamqp

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/retry"
	amqp "github.com/rabbitmq/amqp091-go"
)

// DialFunc opens a new connection; the consumer calls it at start and after
// every connection loss.
type DialFunc func(ctx context.Context) (*amqp.Connection, error)

// DialURL returns a DialFunc for an AMQP URL.
func DialURL(url string) DialFunc {
	return func(context.Context) (*amqp.Connection, error) { return amqp.Dial(url) }
}

// Config configures a [Consumer]. The embedded consume.Config is the
// engine's: Name (required: the dedupe scope and the consumer named in dead
// letters), Retry (nil: full jitter, base 1s, cap 1m, 5 attempts),
// Retention (default 24h; it must exceed MaxAttempts × Cap and QueueTTL),
// MissingID, Fingerprint, MaxErrorBytes, Hooks, Logger and Now, with the
// meanings and defaults documented there.
type Config struct {
	consume.Config
	// Topology names the queues. Topology.Queue is required.
	Topology Topology
	// Declare makes the consumer declare Topology on every connection.
	Declare bool
	// Process runs the handler idempotently for each delivery. Required.
	Process consume.ProcessFunc
	// BatchProcess, with BatchSize > 1, handles deliveries in batches: one
	// dedupe round trip and one transaction per batch (a closure over a SQL
	// store's ProcessBatch). A failed batch falls back to Process one
	// message at a time.
	BatchProcess consume.BatchProcessFunc
	// BatchSize is the largest batch; BatchWait is how long a partial batch
	// waits for more deliveries. Defaults 1 (no batching) and 5ms.
	BatchSize int
	BatchWait time.Duration
	// QueueTTL is the work queue's x-message-ttl, if it has one; it is part
	// of the redelivery horizon checked against Retention.
	QueueTTL time.Duration
	// Concurrency is the number of handler goroutines. Default 4.
	Concurrency int
	// Prefetch is the channel's QoS prefetch count. Default 2×Concurrency.
	// Keep it small enough that a full prefetch is processed well within
	// the broker's consumer timeout (30 minutes by default).
	Prefetch int
	// Reconnect is the backoff between reconnection attempts; default base
	// 100ms, cap 10s, no attempt limit.
	Reconnect *retry.Policy
}

// Consumer consumes one work queue through the shared consume.Engine.
type Consumer struct {
	dial   DialFunc
	cfg    Config
	engine *consume.Engine
	reconn retry.Policy
}

// NewConsumer checks cfg, including the dedupe window against the
// redelivery horizon, and returns a Consumer. It does not connect.
func NewConsumer(dial DialFunc, cfg *Config) (*Consumer, error) {
	if dial == nil || cfg == nil {
		return nil, fmt.Errorf("%w: idemamqp: NewConsumer needs a dial function and a config", idem.ErrInvalidConfig)
	}
	c := &Consumer{dial: dial, cfg: *cfg}
	c.cfg.Topology = c.cfg.Topology.WithDefaults()
	if err := c.cfg.Topology.validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", idem.ErrInvalidConfig, err)
	}
	if c.cfg.Concurrency <= 0 {
		c.cfg.Concurrency = 4
	}
	if c.cfg.BatchSize <= 1 || c.cfg.BatchProcess == nil {
		c.cfg.BatchSize = 1
	}
	if c.cfg.BatchWait <= 0 {
		c.cfg.BatchWait = 5 * time.Millisecond
	}
	if c.cfg.Prefetch <= 0 {
		c.cfg.Prefetch = 2 * c.cfg.Concurrency * c.cfg.BatchSize
	}
	engine, err := consume.New(c.cfg.Process, &c.cfg.Config)
	if err != nil {
		return nil, err
	}
	c.cfg.Config = engine.Config() // the engine's defaults filled in
	p := engine.Policy()
	if err := consume.CheckRetention(c.cfg.Retention, p.MaxAttempts, p.Cap,
		consume.Window{Name: "queue x-message-ttl", D: c.cfg.QueueTTL}); err != nil {
		return nil, err
	}
	c.engine = engine
	rp := retry.Policy{Base: 100 * time.Millisecond, Cap: 10 * time.Second, MaxAttempts: -1}
	if c.cfg.Reconnect != nil {
		rp = *c.cfg.Reconnect
	}
	c.reconn = rp.WithDefaults()
	return c, nil
}

// Engine returns the consumer's engine.
func (c *Consumer) Engine() *consume.Engine { return c.engine }

// Ping dials the broker, opens a channel and, unless Config.Declare is set
// (Run then declares the topology), checks that the work queue, the retry
// queue and the dead-letter exchange exist; a message published to a
// missing retry queue would be dropped silently. The error names the
// broker step or the queue that failed.
func (c *Consumer) Ping(ctx context.Context) error {
	conn, err := c.dial(ctx)
	if err != nil {
		return fmt.Errorf("idemamqp: dial: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("idemamqp: open channel: %w", err)
	}
	defer ch.Close()
	if c.cfg.Declare {
		return nil
	}
	t := c.cfg.Topology
	// A failed passive declare closes the channel: the first one ends it.
	for _, q := range []string{t.Queue, t.RetryQueue} {
		if _, err := ch.QueueDeclarePassive(q, true, false, false, false, nil); err != nil {
			return fmt.Errorf("idemamqp: queue %q: %w", q, err)
		}
	}
	if err := ch.ExchangeDeclarePassive(t.DeadLetterExchange, amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
		return fmt.Errorf("idemamqp: dead-letter exchange %q: %w", t.DeadLetterExchange, err)
	}
	return nil
}

// Run consumes until ctx ends, reconnecting with backoff whenever the
// connection or channel is lost. It returns nil when ctx ends, or the error
// of a session that failed for a reason a reconnect cannot fix (a topology
// mismatch, access refused on the queue).
func (c *Consumer) Run(ctx context.Context) error {
	failures := 0
	for {
		handled, err := c.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		var aerr *amqp.Error
		if errors.As(err, &aerr) && (aerr.Code == amqp.AccessRefused || aerr.Code == amqp.PreconditionFailed) {
			return err
		}
		if handled {
			failures = 0
		}
		d := c.reconn.Delay(failures)
		failures++
		c.cfg.Logger.Warn("idem: amqp session ended; reconnecting", "consumer", c.cfg.Name, "err", err, "in", d)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// session runs one connection until it is lost or ctx ends, and reports
// whether it handled any delivery.
func (c *Consumer) session(ctx context.Context) (handled bool, err error) {
	conn, err := c.dial(ctx)
	if err != nil {
		return false, fmt.Errorf("idemamqp: dial: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return false, fmt.Errorf("idemamqp: open channel: %w", err)
	}
	pub, err := conn.Channel()
	if err != nil {
		return false, fmt.Errorf("idemamqp: open publishing channel: %w", err)
	}
	if err := pub.Confirm(false); err != nil {
		return false, fmt.Errorf("idemamqp: confirm mode: %w", err)
	}
	if c.cfg.Declare {
		if err := Declare(ch, c.cfg.Topology); err != nil {
			return false, err
		}
	}
	if err := ch.Qos(c.cfg.Prefetch, 0, false); err != nil {
		return false, fmt.Errorf("idemamqp: qos: %w", err)
	}
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	deliveries, err := ch.ConsumeWithContext(ctx, c.cfg.Topology.Queue, "", false, false, false, false, nil)
	if err != nil {
		return false, fmt.Errorf("idemamqp: consume %q: %w", c.cfg.Topology.Queue, err)
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		seen bool
		s    = &session{c: c, pub: pub}
	)
	mark := func() {
		mu.Lock()
		seen = true
		mu.Unlock()
	}
	if c.cfg.BatchSize > 1 {
		batches := make(chan []consume.Delivery)
		wg.Go(func() {
			defer close(batches)
			c.collect(deliveries, s, batches)
		})
		for range c.cfg.Concurrency {
			wg.Go(func() {
				for b := range batches {
					c.engine.HandleBatch(ctx, b, c.cfg.BatchProcess)
					mark()
				}
			})
		}
	} else {
		for range c.cfg.Concurrency {
			wg.Go(func() {
				for d := range deliveries {
					c.engine.Handle(ctx, &delivery{s: s, d: d})
					mark()
				}
			})
		}
	}
	// deliveries closes when the channel or connection closes, or when
	// ctx ends (ConsumeWithContext cancels the consumer).
	wg.Wait()
	select {
	case e := <-closed:
		if e != nil {
			return seen, e
		}
	default:
	}
	if ctx.Err() != nil {
		return seen, ctx.Err()
	}
	return seen, errors.New("idemamqp: delivery channel closed")
}

// collect groups deliveries into batches of up to BatchSize, sending a
// partial batch once BatchWait has passed since its first delivery.
func (c *Consumer) collect(deliveries <-chan amqp.Delivery, s *session, batches chan<- []consume.Delivery) {
	var (
		batch []consume.Delivery
		timer *time.Timer
		wait  <-chan time.Time
	)
	flush := func() {
		if len(batch) > 0 {
			batches <- batch
			batch = nil
		}
		if timer != nil {
			timer.Stop()
			wait = nil
		}
	}
	for {
		select {
		case d, ok := <-deliveries:
			if !ok {
				flush()
				return
			}
			batch = append(batch, &delivery{s: s, d: d})
			if len(batch) == 1 {
				timer = time.NewTimer(c.cfg.BatchWait)
				wait = timer.C
			}
			if len(batch) >= c.cfg.BatchSize {
				flush()
			}
		case <-wait:
			flush()
		}
	}
}

// session is what deliveries of one connection share.
type session struct {
	c   *Consumer
	pub *amqp.Channel
}

// publish sends p and waits for the broker's confirmation.
func (s *session) publish(ctx context.Context, exchange, key string, p amqp.Publishing) error {
	dc, err := s.pub.PublishWithDeferredConfirmWithContext(ctx, exchange, key, false, false, p)
	if err != nil {
		return idem.Retryable(fmt.Errorf("idemamqp: publish to %q/%q: %w", exchange, key, err))
	}
	ok, err := dc.WaitContext(ctx)
	if err != nil {
		return idem.Retryable(fmt.Errorf("idemamqp: confirm of publish to %q/%q: %w", exchange, key, err))
	}
	if !ok {
		return idem.Retryable(fmt.Errorf("idemamqp: broker nacked publish to %q/%q", exchange, key))
	}
	return nil
}

// delivery adapts an amqp.Delivery to consume.Delivery.
type delivery struct {
	s *session
	d amqp.Delivery
}

func (d *delivery) ID() string   { return d.d.MessageId }
func (d *delivery) Body() []byte { return d.d.Body }

// Origin is the exchange and routing key the message was first published
// to, as "exchange/routing-key": carried in a header once the message has
// been through the retry queue.
func (d *delivery) Origin() string {
	if o, ok := header(d.d.Headers, consume.HeaderOrigin); ok {
		return o
	}
	return d.d.Exchange + "/" + d.d.RoutingKey
}

func (d *delivery) State() consume.State {
	return consume.ParseState(func(name string) (string, bool) { return header(d.d.Headers, name) })
}

func (d *delivery) Ack(context.Context) error { return d.d.Ack(false) }

func (d *delivery) Requeue(context.Context) error { return d.d.Nack(false, true) }

func (d *delivery) Retry(ctx context.Context, after time.Duration, st consume.State) error {
	p := d.copy(st.Headers())
	// A TTL of 0 would still go through the retry queue at once.
	p.Expiration = strconv.FormatInt(max(after.Milliseconds(), 0), 10)
	if err := d.s.publish(ctx, "", d.s.c.cfg.Topology.RetryQueue, p); err != nil {
		return err
	}
	return d.d.Ack(false)
}

// DeadLetter publishes a copy to the dead-letter exchange and acks the
// original once the broker confirms it. RabbitMQ has no dedupe on publish:
// a message redelivered after a crash between the two steps is
// dead-lettered again, with the same dead-letter id ([DeadLetterID]), which
// [ListDeadLetters] and [Redrive] use to keep one.
func (d *delivery) DeadLetter(ctx context.Context, dl consume.DeadLetter) error {
	t := d.s.c.cfg.Topology
	dl.DeadLetterID = DeadLetterID(t.Queue, d.d.MessageId, d.d.Body)
	if err := d.s.publish(ctx, t.DeadLetterExchange, t.DeadLetterQueue, d.copy(dl.Headers())); err != nil {
		return err
	}
	return d.d.Ack(false)
}

// DeadLetterID returns the dead-letter id of a message consumed from the
// work queue queue with message id messageID (possibly empty) and body:
// RabbitMQ gives a redelivered message no position of its own, so the id
// is derived from what a redelivery keeps (the queue, the message id and
// the content). A message dead-lettered again after a crash, and a
// duplicate publish of the same message that fails the same way, get the
// same id.
func DeadLetterID(queue, messageID string, body []byte) string {
	return consume.DeadLetterID("amqp", queue, messageID, idem.ContentID(body))
}

// copy returns the message as a persistent publishing with its properties,
// its headers (x-death included) and extra headers on top.
func (d *delivery) copy(extra map[string]string) amqp.Publishing {
	h := amqp.Table{}
	maps.Copy(h, d.d.Headers)
	for k, v := range extra {
		h[k] = v
	}
	h[consume.HeaderOrigin] = d.Origin()
	return amqp.Publishing{
		Headers:         h,
		ContentType:     d.d.ContentType,
		ContentEncoding: d.d.ContentEncoding,
		DeliveryMode:    amqp.Persistent,
		Priority:        d.d.Priority,
		CorrelationId:   d.d.CorrelationId,
		ReplyTo:         d.d.ReplyTo,
		MessageId:       d.d.MessageId,
		Timestamp:       d.d.Timestamp,
		Type:            d.d.Type,
		AppId:           d.d.AppId,
		Body:            d.d.Body,
	}
}

// header returns a string header; other types are formatted.
func header(h amqp.Table, name string) (string, bool) {
	v, ok := h[name]
	if !ok || v == nil {
		return "", false
	}
	switch v := v.(type) {
	case string:
		return v, true
	case []byte:
		return string(v), true
	}
	return fmt.Sprint(v), true
}

// splitOrigin splits "exchange/routing-key" (AMQP exchange names hold no
// slash).
func splitOrigin(o string) (exchange, key string, ok bool) {
	return strings.Cut(o, "/")
}
