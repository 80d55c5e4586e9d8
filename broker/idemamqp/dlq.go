package idemamqp

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consume"
	amqp "github.com/rabbitmq/amqp091-go"
)

// HeaderRedrives counts how many times a dead letter was redriven.
const HeaderRedrives = "x-idem-redrives"

// DefaultMaxRedrives caps redrives of one message.
const DefaultMaxRedrives = 3

// XDeath is one entry of RabbitMQ's x-death header.
type XDeath struct {
	Queue       string
	Reason      string
	Exchange    string
	RoutingKeys []string
	Count       int64
	Time        time.Time
}

// DeadMessage is a dead letter with its failure context.
type DeadMessage struct {
	consume.DeadLetter
	// ID is the message id.
	ID string
	// Redrives is how many times it was redriven already.
	Redrives int
	// XDeath holds RabbitMQ's dead-lettering history, newest first.
	XDeath  []XDeath
	Headers amqp.Table
	Body    []byte
	// Published is the message's timestamp property (zero if unset).
	Published time.Time
	// Copies is, in [ListDeadLetters], how many of the messages read carry
	// this dead letter's DeadLetterID (1: no repeat). A repeat is the same
	// message dead-lettered again after a redelivery (see [DeadLetterID]).
	Copies int
	// Repeat is set by [ScanDeadLetters] on a message whose DeadLetterID
	// an earlier message of the same scan carried.
	Repeat bool
}

// repeats remembers the dead-letter ids seen in one read of a dead-letter
// queue. Messages without one (dead-lettered by older versions or by the
// broker itself) are never repeats.
type repeats map[string]bool

// see reports whether m's dead-letter id was seen before, and notes it.
func (r repeats) see(m DeadMessage) bool {
	if m.DeadLetterID == "" {
		return false
	}
	seen := r[m.DeadLetterID]
	r[m.DeadLetterID] = true
	return seen
}

// Age is how long ago the message last failed (or was published).
func (m DeadMessage) Age(now time.Time) time.Duration {
	switch {
	case !m.LastFailure.IsZero():
		return now.Sub(m.LastFailure)
	case !m.Published.IsZero():
		return now.Sub(m.Published)
	}
	return 0
}

func parseDeadMessage(d amqp.Delivery) DeadMessage {
	m := DeadMessage{
		DeadLetter: consume.ParseDeadLetter(func(n string) (string, bool) { return header(d.Headers, n) }),
		ID:         d.MessageId, Headers: d.Headers, Body: d.Body, Published: d.Timestamp,
	}
	if v, ok := header(d.Headers, HeaderRedrives); ok {
		m.Redrives, _ = strconv.Atoi(v)
	}
	if m.Reason == "" {
		// Dead-lettered by the broker itself (TTL, rejection, length limit).
		if xs, ok := d.Headers["x-death"].([]any); ok && len(xs) > 0 {
			if t, ok := xs[0].(amqp.Table); ok {
				// Not one of idem's reasons: RabbitMQ's own ("expired",
				// "rejected", "maxlen", "delivery_limit").
				r, _ := t["reason"].(string)
				m.Reason = idem.DeadReason(r)
			}
		}
	}
	if xs, ok := d.Headers["x-death"].([]any); ok {
		for _, x := range xs {
			t, ok := x.(amqp.Table)
			if !ok {
				continue
			}
			e := XDeath{}
			e.Queue, _ = t["queue"].(string)
			e.Reason, _ = t["reason"].(string)
			e.Exchange, _ = t["exchange"].(string)
			e.Count, _ = t["count"].(int64)
			e.Time, _ = t["time"].(time.Time)
			if rks, ok := t["routing-keys"].([]any); ok {
				for _, rk := range rks {
					if s, ok := rk.(string); ok {
						e.RoutingKeys = append(e.RoutingKeys, s)
					}
				}
			}
			m.XDeath = append(m.XDeath, e)
		}
	}
	return m
}

// ListDeadLetters reads up to limit messages of the dead-letter queue and
// returns them with their failure context, without consuming them: they
// are fetched unacknowledged and go back to the queue when the channel
// closes. Repeats of a dead letter (the same DeadLetterID) are returned
// once, the first, with their number in Copies.
func ListDeadLetters(ctx context.Context, conn *amqp.Connection, queue string, limit int) ([]DeadMessage, error) {
	if limit <= 0 {
		limit = 100
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("idemamqp: open channel: %w", err)
	}
	defer ch.Close()
	var out []DeadMessage
	first := map[string]int{} // dead-letter id -> index in out
	for range limit {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		d, ok, err := ch.Get(queue, false)
		if err != nil {
			return out, fmt.Errorf("idemamqp: read %q: %w", queue, err)
		}
		if !ok {
			break
		}
		m := parseDeadMessage(d)
		if i, seen := first[m.DeadLetterID]; seen && m.DeadLetterID != "" {
			out[i].Copies++
			continue
		}
		first[m.DeadLetterID] = len(out)
		m.Copies = 1
		out = append(out, m)
	}
	return out, nil
}

// RedriveOptions tune [Redrive].
type RedriveOptions struct {
	// MaxRedrives refuses to redrive a message redriven this many times
	// already (it stays in the dead letters). Default DefaultMaxRedrives.
	MaxRedrives int
	// Limit bounds the messages examined. Default 1000.
	Limit int
}

// RedriveResult says what [Redrive] did.
type RedriveResult struct {
	// Redriven lists the ids sent back to their origin.
	Redriven []string
	// Capped lists the ids left in the dead letters because they reached
	// MaxRedrives.
	Capped []string
	// Dropped lists the ids of repeats removed from the dead letters: a
	// message with the same DeadLetterID was redriven in the same run.
	Dropped []string
}

// Redrive sends the dead letters that match back to their original
// exchange and routing key, with the failure headers cleared (so they get
// a fresh set of attempts) and HeaderRedrives incremented. Each is acked
// from the dead-letter queue only after the broker confirms the copy. A
// repeat of a dead letter redriven in the same run (the same DeadLetterID)
// is acked without a copy and listed in Dropped. It is a manual operation:
// run it after fixing what made the messages fail.
func Redrive(ctx context.Context, conn *amqp.Connection, queue string, match func(DeadMessage) bool, opts *RedriveOptions) (RedriveResult, error) {
	var res RedriveResult
	o := RedriveOptions{MaxRedrives: DefaultMaxRedrives, Limit: 1000}
	if opts != nil {
		if opts.MaxRedrives > 0 {
			o.MaxRedrives = opts.MaxRedrives
		}
		if opts.Limit > 0 {
			o.Limit = opts.Limit
		}
	}
	ch, err := conn.Channel()
	if err != nil {
		return res, fmt.Errorf("idemamqp: open channel: %w", err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return res, fmt.Errorf("idemamqp: confirm mode: %w", err)
	}
	redriven := map[string]bool{} // dead-letter ids
	for range o.Limit {
		d, ok, err := ch.Get(queue, false)
		if err != nil {
			return res, fmt.Errorf("idemamqp: read %q: %w", queue, err)
		}
		if !ok {
			break
		}
		m := parseDeadMessage(d)
		if match != nil && !match(m) {
			continue // stays unacked; back in the queue when the channel closes
		}
		if m.DeadLetterID != "" && redriven[m.DeadLetterID] {
			if err := d.Ack(false); err != nil {
				return res, fmt.Errorf("idemamqp: ack repeat of %q: %w", m.ID, err)
			}
			res.Dropped = append(res.Dropped, m.ID)
			continue
		}
		if m.Redrives >= o.MaxRedrives {
			res.Capped = append(res.Capped, m.ID)
			continue
		}
		exchange, key, ok := splitOrigin(m.Origin)
		if !ok {
			exchange, key = "", firstRoutingKey(m)
		}
		if key == "" && exchange == "" {
			return res, fmt.Errorf("idemamqp: message %q has no origin to redrive it to", m.ID)
		}
		h := amqp.Table{}
		maps.Copy(h, d.Headers)
		for _, k := range []string{consume.HeaderAttempts, consume.HeaderInfraRetries, consume.HeaderFirstFailure,
			consume.HeaderLastFailure, consume.HeaderLastError, consume.HeaderReason, consume.HeaderConsumer, consume.HeaderDeadLetterID} {
			delete(h, k)
		}
		h[HeaderRedrives] = strconv.Itoa(m.Redrives + 1)
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, false, false, amqp.Publishing{
			Headers: h, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding, DeliveryMode: amqp.Persistent,
			CorrelationId: d.CorrelationId, MessageId: d.MessageId, Timestamp: d.Timestamp, Type: d.Type, AppId: d.AppId, Body: d.Body,
		})
		if err != nil {
			return res, fmt.Errorf("idemamqp: redrive %q: %w", m.ID, err)
		}
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			return res, fmt.Errorf("idemamqp: redrive %q not confirmed: %w", m.ID, errors.Join(err, errors.New("nacked")))
		}
		if err := d.Ack(false); err != nil {
			return res, fmt.Errorf("idemamqp: ack %q after redrive: %w", m.ID, err)
		}
		res.Redriven = append(res.Redriven, m.ID)
		redriven[m.DeadLetterID] = true
	}
	return res, nil
}

func firstRoutingKey(m DeadMessage) string {
	for i := len(m.XDeath) - 1; i >= 0; i-- {
		if len(m.XDeath[i].RoutingKeys) > 0 {
			return m.XDeath[i].RoutingKeys[0]
		}
	}
	return ""
}

// Publish publishes p persistently on ch, which must be in confirm mode,
// and waits for the broker's confirmation. The message id is p.MessageId,
// or idem.ContentID (the SHA-256 of the body) when it is empty, so that a retried publish
// of the same content is deduplicated by the consumer.
func Publish(ctx context.Context, ch *amqp.Channel, exchange, key string, p amqp.Publishing) error {
	if p.MessageId == "" {
		p.MessageId = idem.ContentID(p.Body)
	}
	p.DeliveryMode = amqp.Persistent
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, false, false, p)
	if err != nil {
		return fmt.Errorf("idemamqp: publish: %w", err)
	}
	if dc == nil {
		return errors.New("idemamqp: publish: the channel is not in confirm mode")
	}
	ok, err := dc.WaitContext(ctx)
	if err != nil {
		return fmt.Errorf("idemamqp: publish confirm: %w", err)
	}
	if !ok {
		return errors.New("idemamqp: publish nacked by the broker")
	}
	return nil
}

// Report describes the dead letter for a person: why it failed, how often,
// when, where it came from and RabbitMQ's own dead-lettering history.
func (m DeadMessage) Report(now time.Time) string {
	var b []byte
	b = fmt.Appendf(b, "message %q: %s after %d attempt(s)", m.ID, orDash(string(m.Reason)), m.Attempts)
	if m.Consumer != "" {
		b = fmt.Appendf(b, " in consumer %q", m.Consumer)
	}
	b = fmt.Appendf(b, "\n  origin: %s\n", orDash(m.Origin))
	if m.DeadLetterID != "" {
		b = fmt.Appendf(b, "  dead-letter id: %s", m.DeadLetterID)
		if m.Copies > 1 {
			b = fmt.Appendf(b, " (%d copies: dead-lettered again after a redelivery)", m.Copies)
		}
		b = append(b, '\n')
	}
	if !m.FirstFailure.IsZero() {
		b = fmt.Appendf(b, "  failures: first %s, last %s (%s ago)\n",
			m.FirstFailure.UTC().Format(time.RFC3339), m.LastFailure.UTC().Format(time.RFC3339), m.Age(now).Round(time.Second))
	}
	b = fmt.Appendf(b, "  last error: %s\n", orDash(m.LastError))
	if m.Redrives > 0 {
		b = fmt.Appendf(b, "  redriven %d time(s)\n", m.Redrives)
	}
	for _, x := range m.XDeath {
		b = fmt.Appendf(b, "  x-death: %s from queue %q (exchange %q, routing keys %v) ×%d, last %s\n",
			x.Reason, x.Queue, x.Exchange, x.RoutingKeys, x.Count, x.Time.UTC().Format(time.RFC3339))
	}
	b = fmt.Appendf(b, "  body: %d bytes", len(m.Body))
	return string(b)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
