package idemnats

import (
	"context"
	"errors"
	"fmt"

	"github.com/idem-go/idem"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Publisher publishes to JetStream with a Nats-Msg-Id on every message, so
// that the stream drops a producer's retry inside its duplicate window.
type Publisher struct {
	js jetstream.JetStream
}

// NewPublisher returns a Publisher over js.
func NewPublisher(js jetstream.JetStream) *Publisher { return &Publisher{js: js} }

// PublishResult is the stream's answer to a publish.
type PublishResult struct {
	// ID is the Nats-Msg-Id that was sent.
	ID string
	// Stream and Sequence locate the stored message (for a duplicate, the
	// one stored first).
	Stream   string
	Sequence uint64
	// Duplicate reports that the stream already had a message with ID
	// inside its duplicate window and did not store this one.
	Duplicate bool
}

// Publish publishes data to subject with id as its Nats-Msg-Id, or
// idem.ContentID(data) when id is empty, and waits for the stream's ack.
// Two publishes of the same bytes then get the same id, so the stream's
// duplicate window and idem's dedupe both treat them as one message; a
// change to any byte makes a new message.
func (p *Publisher) Publish(ctx context.Context, subject string, data []byte, id string) (PublishResult, error) {
	m := nats.NewMsg(subject)
	m.Data = data
	return p.PublishMsg(ctx, m, id)
}

// PublishMsg is [Publisher.Publish] for a message with headers. It sets
// m's Nats-Msg-Id header.
func (p *Publisher) PublishMsg(ctx context.Context, m *nats.Msg, id string) (PublishResult, error) {
	if m == nil {
		return PublishResult{}, errors.New("idemnats: nil message")
	}
	if id == "" {
		id = idem.ContentID(m.Data)
	}
	if m.Header == nil {
		m.Header = nats.Header{}
	}
	m.Header.Set(jetstream.MsgIDHeader, id)
	ack, err := p.js.PublishMsg(ctx, m)
	if err != nil {
		return PublishResult{ID: id}, fmt.Errorf("idemnats: publish %q to %q: %w", id, m.Subject, err)
	}
	return PublishResult{ID: id, Stream: ack.Stream, Sequence: ack.Sequence, Duplicate: ack.Duplicate}, nil
}
