package idemnats

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/outbox"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// OutboxConfig configures an [OutboxPublisher].
type OutboxConfig struct {
	// AckTimeout bounds how long one Publish waits for the stream's
	// PubAcks; a message whose ack has not come by then gets a retryable
	// error (the relay publishes it again, with the same Nats-Msg-Id).
	// Default 30s.
	AckTimeout time.Duration
}

// OutboxPublisher is the outbox relay's [outbox.Publisher] for JetStream:
// each message is published to the subject Message.Topic with its
// Message.ID as the Nats-Msg-Id, and is confirmed only by the stream's
// PubAck.
//
// A batch is published asynchronously (PublishMsgAsync) and then every
// ack is awaited, so a batch costs about one round trip, not one per
// message. A PubAck that reports a duplicate (the stream already stored
// that Nats-Msg-Id inside its duplicate window: the relay published it
// before a crash) confirms the message like a first one.
//
// Permanent errors ([outbox.PermanentError]): a subject no stream captures,
// a message over the connection's max payload or the stream's maximum
// message size, an invalid subject or header, an invalid id. Everything
// else is retried by the relay: a disconnection or a missing ack is marked
// idem.Retryable (an outage, which the relay's MaxAttempts does not
// count), an error answer of the stream (a full stream, say) counts as an
// attempt.
//
// Create the JetStream context with [jetstream.WithPublishAsyncTimeout]
// (at most AckTimeout): the client then also forgets an ack that never
// comes, instead of counting it against its pending limit.
type OutboxPublisher struct {
	js  jetstream.JetStream
	cfg OutboxConfig
}

var _ outbox.Publisher = (*OutboxPublisher)(nil)

// NewOutboxPublisher returns an OutboxPublisher over js (cfg may be nil).
// It does no I/O.
func NewOutboxPublisher(js jetstream.JetStream, cfg *OutboxConfig) (*OutboxPublisher, error) {
	if js == nil {
		return nil, fmt.Errorf("%w: idemnats: NewOutboxPublisher needs a JetStream context", idem.ErrInvalidConfig)
	}
	p := &OutboxPublisher{js: js}
	if cfg != nil {
		p.cfg = *cfg
	}
	if p.cfg.AckTimeout < 0 {
		return nil, fmt.Errorf("%w: idemnats: OutboxConfig.AckTimeout %v is negative", idem.ErrInvalidConfig, p.cfg.AckTimeout)
	}
	if p.cfg.AckTimeout == 0 {
		p.cfg.AckTimeout = 30 * time.Second
	}
	return p, nil
}

// Publish publishes msgs and waits for their PubAcks; it returns one
// error per message (nil: the stream stored it, or already had it).
func (p *OutboxPublisher) Publish(ctx context.Context, msgs []outbox.Message) []error {
	errs := make([]error, len(msgs))
	ctx, cancel := context.WithTimeout(ctx, p.cfg.AckTimeout)
	defer cancel()
	futures := make([]jetstream.PubAckFuture, len(msgs))
	for i, m := range msgs {
		nm, err := natsMsg(m)
		if err != nil {
			errs[i] = outbox.PermanentError(err)
			continue
		}
		if err := ctx.Err(); err != nil {
			errs[i] = p.wrap(m, context.Cause(ctx))
			continue
		}
		f, err := p.js.PublishMsgAsync(nm)
		if err != nil {
			errs[i] = p.wrap(m, err)
			continue
		}
		futures[i] = f
	}
	noStream := map[string]bool{} // subject → no stream captures it
	for i, f := range futures {
		if f == nil {
			continue
		}
		select {
		case <-f.Ok():
			// Stored, or a duplicate of one stored: confirmed either way.
		case err := <-f.Err():
			if errors.Is(err, jetstream.ErrNoStreamResponse) {
				subject := msgs[i].Topic
				missing, known := noStream[subject]
				if !known {
					missing = p.streamMissing(ctx, subject)
					noStream[subject] = missing
				}
				if missing {
					errs[i] = outbox.PermanentError(fmt.Errorf("idemnats: publish %q: no stream captures subject %q: %w", msgs[i].ID, subject, err))
					continue
				}
			}
			errs[i] = p.wrap(msgs[i], err)
		case <-ctx.Done():
			errs[i] = p.wrap(msgs[i], fmt.Errorf("no PubAck: %w", context.Cause(ctx)))
		}
	}
	return errs
}

// streamMissing reports whether the server says that no stream captures
// subject (a no-responders answer can also come from a stream that is
// electing a leader, which is worth retrying).
func (p *OutboxPublisher) streamMissing(ctx context.Context, subject string) bool {
	_, err := p.js.StreamNameBySubject(ctx, subject)
	return errors.Is(err, jetstream.ErrStreamNotFound)
}

// wrap names the message in err and marks the errors retrying cannot fix
// as permanent.
func (p *OutboxPublisher) wrap(m outbox.Message, err error) error {
	err = fmt.Errorf("idemnats: publish %q to %q: %w", m.ID, m.Topic, err)
	var api *jetstream.APIError
	switch {
	case errors.Is(err, nats.ErrMaxPayload), errors.Is(err, nats.ErrBadSubject), errors.Is(err, nats.ErrBadHeaderMsg):
		return outbox.PermanentError(err)
	case errors.As(err, &api) && api.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum:
		return outbox.PermanentError(err)
	case errors.As(err, &api):
		return err // the stream refused it (full, say): counts as an attempt
	}
	// No ack, a lost connection, no responders from an existing stream:
	// the broker is away, which the relay does not count as an attempt.
	return idem.Retryable(err)
}

// natsMsg builds the JetStream message of m, or says why it cannot be
// published at all.
func natsMsg(m outbox.Message) (*nats.Msg, error) {
	if err := idem.ValidateKey(m.ID); err != nil {
		return nil, fmt.Errorf("idemnats: outbox message id: %w", err)
	}
	if err := validSubject(m.Topic); err != nil {
		return nil, fmt.Errorf("idemnats: outbox message %q: %w", m.ID, err)
	}
	nm := nats.NewMsg(m.Topic)
	nm.Data = m.Payload
	for k, v := range m.Headers {
		if k == "" || strings.ContainsAny(k, ": \t\r\n") || strings.ContainsAny(v, "\r\n") {
			return nil, fmt.Errorf("idemnats: outbox message %q: header %q: a NATS header name must be non-empty without ':' or white space, and a value without line breaks", m.ID, k)
		}
		if strings.EqualFold(k, jetstream.MsgIDHeader) {
			continue // the id is the message's own
		}
		nm.Header.Set(k, v)
	}
	nm.Header.Set(jetstream.MsgIDHeader, m.ID)
	return nm, nil
}

// validSubject checks that subject is one a message can be published to:
// non-empty tokens separated by dots, no wildcards, no white space.
func validSubject(subject string) error {
	if subject == "" {
		return errors.New("empty subject (Message.Topic)")
	}
	if len(subject) > maxSubject {
		return fmt.Errorf("subject of %d bytes, over %d", len(subject), maxSubject)
	}
	for tok := range strings.SplitSeq(subject, ".") {
		if tok == "" || tok == "*" || tok == ">" || strings.ContainsAny(tok, " \t\r\n") {
			return fmt.Errorf("subject %q cannot be published to (empty token, wildcard or white space)", subject)
		}
	}
	return nil
}

// maxSubject bounds a subject's length; NATS itself has no fixed limit,
// but a subject is sent with every message.
const maxSubject = 1024
