package idemkafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/outbox"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// OutboxConfig configures an [OutboxPublisher].
type OutboxConfig struct {
	// IDHeader is the record header that carries Message.ID; default
	// [DefaultIDHeader], which a [Consumer] reads by default.
	IDHeader string
	// AckTimeout bounds how long one Publish waits for the produce
	// responses; a record not confirmed by then gets a retryable error
	// (the relay produces it again, with the same id header). Default 30s.
	AckTimeout time.Duration
}

// OutboxPublisher is the outbox relay's [outbox.Publisher] for Kafka: each
// message is produced to the topic Message.Topic with Message.Key as the
// record key, so that the events of one key land on one partition in
// order, and Message.ID in the [DefaultIDHeader] header, the consumer's
// dedupe key; Message.Headers become record headers.
//
// A batch is produced at once and each record's produce response awaited.
// The client's idempotent producer (franz-go's default;
// [NewOutboxPublisher] refuses a client without it) removes the client's
// own retries; the relay's retries after a crash carry the same id header
// and are removed by idem's consumers.
//
// Permanent errors ([outbox.PermanentError]): a record too large for the
// client's batch limit or the broker, a topic that does not exist (after
// the client's UnknownTopicRetries) or is invalid, an invalid id, and a
// message without a topic. Everything else is retried by the relay: a
// missing produce response, a lost connection or a retriable broker error
// is marked idem.Retryable (an outage, which the relay's MaxAttempts does
// not count); any other broker error counts as an attempt.
type OutboxPublisher struct {
	cl  *kgo.Client
	cfg OutboxConfig
}

var _ outbox.Publisher = (*OutboxPublisher)(nil)

// NewOutboxPublisher returns an OutboxPublisher producing with cl (cfg may
// be nil). It does no I/O. It refuses a client whose idempotent producer
// is disabled (kgo.DisableIdempotentWrite).
func NewOutboxPublisher(cl *kgo.Client, cfg *OutboxConfig) (*OutboxPublisher, error) {
	if cl == nil {
		return nil, fmt.Errorf("%w: idemkafka: NewOutboxPublisher needs a client", idem.ErrInvalidConfig)
	}
	if off, _ := cl.OptValue(kgo.DisableIdempotentWrite).(bool); off {
		return nil, fmt.Errorf("%w: idemkafka: the client's idempotent producer is disabled (kgo.DisableIdempotentWrite): the client's own produce retries could write an event twice", idem.ErrInvalidConfig)
	}
	p := &OutboxPublisher{cl: cl}
	if cfg != nil {
		p.cfg = *cfg
	}
	if p.cfg.IDHeader == "" {
		p.cfg.IDHeader = DefaultIDHeader
	}
	if p.cfg.AckTimeout < 0 {
		return nil, fmt.Errorf("%w: idemkafka: OutboxConfig.AckTimeout %v is negative", idem.ErrInvalidConfig, p.cfg.AckTimeout)
	}
	if p.cfg.AckTimeout == 0 {
		p.cfg.AckTimeout = 30 * time.Second
	}
	return p, nil
}

// Publish produces msgs and waits for their produce responses; it returns
// one error per message (nil: the broker acknowledged the record).
func (p *OutboxPublisher) Publish(ctx context.Context, msgs []outbox.Message) []error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.AckTimeout)
	defer cancel()
	if len(msgs) == 0 {
		return nil
	}
	// The promises write here; a promise that fires after the wait gave
	// up writes into state nobody reads any more.
	var (
		mu       sync.Mutex
		results  = make([]error, len(msgs))
		answered = make([]bool, len(msgs))
		pending  = len(msgs)
		done     = make(chan struct{})
	)
	settle := func(i int, err error) {
		mu.Lock()
		defer mu.Unlock()
		results[i], answered[i] = err, true
		if pending--; pending == 0 {
			close(done)
		}
	}
	for i, m := range msgs {
		r, err := p.record(m)
		if err != nil {
			settle(i, outbox.PermanentError(err))
			continue
		}
		p.cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
			if err != nil {
				err = p.wrap(m, err)
			}
			settle(i, err)
		})
	}
	select {
	case <-done:
	case <-ctx.Done():
	}
	mu.Lock()
	errs := slices.Clone(results)
	for i := range errs {
		if !answered[i] {
			errs[i] = idem.Retryable(fmt.Errorf("idemkafka: produce %q to %q: no produce response: %w", msgs[i].ID, msgs[i].Topic, context.Cause(ctx)))
		}
	}
	mu.Unlock()
	p.alone(ctx, msgs, errs)
	return errs
}

// alone produces again, one at a time, each message that failed with
// MESSAGE_TOO_LARGE, and keeps that verdict (permanent) only for a record
// refused on its own. The broker refuses a whole batch for one record over
// its max.message.bytes, and the client then fails every record of the
// batch (and of its partition's buffer), so the others get their own
// answer here instead of being dead-lettered with the culprit.
func (p *OutboxPublisher) alone(ctx context.Context, msgs []outbox.Message, errs []error) {
	for i, err := range errs {
		if !errors.Is(err, kerr.MessageTooLarge) {
			continue
		}
		r, err := p.record(msgs[i])
		if err != nil {
			continue // not reached: the record was built before
		}
		if err := p.cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			errs[i] = p.wrap(msgs[i], err)
		} else {
			errs[i] = nil
		}
	}
}

// record builds the Kafka record of m, or says why it cannot be produced.
func (p *OutboxPublisher) record(m outbox.Message) (*kgo.Record, error) {
	if err := idem.ValidateKey(m.ID); err != nil {
		return nil, fmt.Errorf("idemkafka: outbox message id: %w", err)
	}
	if m.Topic == "" {
		return nil, fmt.Errorf("idemkafka: outbox message %q has no topic", m.ID)
	}
	r := &kgo.Record{Topic: m.Topic, Value: m.Payload}
	if m.Key != "" {
		r.Key = []byte(m.Key)
	}
	keys := make([]string, 0, len(m.Headers))
	for k := range m.Headers {
		if k != p.cfg.IDHeader { // the id is the message's own
			keys = append(keys, k)
		}
	}
	slices.Sort(keys) // the same event, the same record
	r.Headers = make([]kgo.RecordHeader, 0, len(keys)+1)
	r.Headers = append(r.Headers, kgo.RecordHeader{Key: p.cfg.IDHeader, Value: []byte(m.ID)})
	for _, k := range keys {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: []byte(m.Headers[k])})
	}
	return r, nil
}

// wrap names the message in err and marks the errors retrying cannot fix
// as permanent.
func (p *OutboxPublisher) wrap(m outbox.Message, err error) error {
	err = fmt.Errorf("idemkafka: produce %q to %q: %w", m.ID, m.Topic, err)
	for _, e := range []error{kerr.MessageTooLarge, kerr.RecordListTooLarge, kerr.UnknownTopicOrPartition,
		kerr.InvalidTopicException, kerr.InvalidRecord, kerr.UnknownTopicID} {
		if errors.Is(err, e) {
			return outbox.PermanentError(err)
		}
	}
	var ke *kerr.Error
	if errors.As(err, &ke) && !ke.Retriable {
		return err // refused by the broker for another reason: counts as an attempt
	}
	// A retriable broker error, a record timeout, a lost connection, no
	// answer: the broker is away, which the relay does not count as an
	// attempt.
	return idem.Retryable(err)
}
