package idemsqs

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/outbox"
)

// OutboxConfig configures an [OutboxPublisher].
type OutboxConfig struct {
	// DefaultGroupID is the FIFO MessageGroupId of a message without a Key.
	// Default "idem-outbox": all such messages of a queue in one group,
	// delivered in order.
	DefaultGroupID string
	// MaxMessageBytes bounds one message (body and attributes, as SQS
	// counts them) and one SendMessageBatch call. Default 262,144 (256
	// KiB), SQS's classic limit; a queue whose MaximumMessageSize is
	// higher may raise it up to 1 MiB.
	MaxMessageBytes int
	// AckTimeout bounds one Publish; a message SQS has not answered for by
	// then gets a retryable error. Default 30s.
	AckTimeout time.Duration
	// OneByOne sends each message with its own SendMessage (up to ten at a
	// time) instead of SendMessageBatch: for SQS-compatible servers that
	// drop the message attributes of batch entries, as goaws v0.4 does.
	// Amazon SQS needs no such thing.
	OneByOne bool
}

// OutboxPublisher is the outbox relay's [outbox.Publisher] for SQS:
// Message.Topic is the queue URL (not its name: resolving a name costs a
// GetQueueUrl call per queue), Message.ID the [AttrID] attribute the
// [Consumer] dedupes on, Message.Headers further String attributes (SQS
// allows ten with AttrID). On a FIFO queue (a URL ending in ".fifo") the
// MessageGroupId is Message.Key (or OutboxConfig.DefaultGroupID) and the
// MessageDeduplicationId is Message.ID, so SQS itself drops the relay's
// repeat within its five-minute window.
//
// Messages go out with SendMessageBatch, up to ten per call and
// MaxMessageBytes per call, in order, queue by queue; each entry's result
// is its message's. A message SQS refuses as the sender's fault (invalid
// contents or attributes) is permanent, as are a message over
// MaxMessageBytes, a body SQS cannot carry (not UTF-8, or characters
// outside what SQS allows), more than ten attributes, an invalid id, and
// a queue that does not exist. Everything else is retried by the relay:
// throttling, a server fault and a network failure are marked
// idem.Retryable (an outage, which the relay's MaxAttempts does not
// count); a call refused as the sender's fault counts as an attempt.
type OutboxPublisher struct {
	client *sqs.Client
	cfg    OutboxConfig
}

var _ outbox.Publisher = (*OutboxPublisher)(nil)

// The bounds of one SendMessageBatch call.
const (
	maxBatchEntries      = 10
	defaultMaxBytes      = 256 << 10
	maxMaxBytes          = 1 << 20
	defaultOutboxGroupID = "idem-outbox"
)

// NewOutboxPublisher returns an OutboxPublisher sending with client (cfg
// may be nil). It does no I/O.
func NewOutboxPublisher(client *sqs.Client, cfg *OutboxConfig) (*OutboxPublisher, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: idemsqs: NewOutboxPublisher needs a client", idem.ErrInvalidConfig)
	}
	p := &OutboxPublisher{client: client}
	if cfg != nil {
		p.cfg = *cfg
	}
	if p.cfg.DefaultGroupID == "" {
		p.cfg.DefaultGroupID = defaultOutboxGroupID
	}
	switch {
	case p.cfg.MaxMessageBytes == 0:
		p.cfg.MaxMessageBytes = defaultMaxBytes
	case p.cfg.MaxMessageBytes < 1024 || p.cfg.MaxMessageBytes > maxMaxBytes:
		return nil, fmt.Errorf("%w: idemsqs: OutboxConfig.MaxMessageBytes %d is outside SQS's 1,024–1,048,576", idem.ErrInvalidConfig, p.cfg.MaxMessageBytes)
	}
	if p.cfg.AckTimeout < 0 {
		return nil, fmt.Errorf("%w: idemsqs: OutboxConfig.AckTimeout %v is negative", idem.ErrInvalidConfig, p.cfg.AckTimeout)
	}
	if p.cfg.AckTimeout == 0 {
		p.cfg.AckTimeout = 30 * time.Second
	}
	return p, nil
}

// outgoing is one message ready to send.
type outgoing struct {
	i    int // its index in the batch
	in   *sqs.SendMessageInput
	size int
}

// Publish sends msgs and returns one error per message (nil: SQS accepted
// it).
func (p *OutboxPublisher) Publish(ctx context.Context, msgs []outbox.Message) []error {
	errs := make([]error, len(msgs))
	if len(msgs) == 0 {
		return errs
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.AckTimeout)
	defer cancel()
	// Queue by queue, in the order of the batch.
	var queues []string
	byQueue := map[string][]outgoing{}
	for i, m := range msgs {
		in, size, err := p.input(m)
		if err != nil {
			errs[i] = outbox.PermanentError(err)
			continue
		}
		if _, ok := byQueue[m.Topic]; !ok {
			queues = append(queues, m.Topic)
		}
		byQueue[m.Topic] = append(byQueue[m.Topic], outgoing{i: i, in: in, size: size})
	}
	for _, q := range queues {
		if p.cfg.OneByOne {
			p.sendEach(ctx, msgs, byQueue[q], errs)
			continue
		}
		for _, chunk := range chunks(byQueue[q], p.cfg.MaxMessageBytes) {
			p.sendBatch(ctx, q, msgs, chunk, errs)
		}
	}
	return errs
}

// chunks splits a queue's messages into SendMessageBatch calls of at most
// ten entries and maxBytes.
func chunks(out []outgoing, maxBytes int) [][]outgoing {
	var all [][]outgoing
	var cur []outgoing
	size := 0
	for _, o := range out {
		if len(cur) == maxBatchEntries || (len(cur) > 0 && size+o.size > maxBytes) {
			all = append(all, cur)
			cur, size = nil, 0
		}
		cur = append(cur, o)
		size += o.size
	}
	if len(cur) > 0 {
		all = append(all, cur)
	}
	return all
}

// sendBatch sends one chunk with SendMessageBatch and records each
// entry's result.
func (p *OutboxPublisher) sendBatch(ctx context.Context, queue string, msgs []outbox.Message, chunk []outgoing, errs []error) {
	entries := make([]types.SendMessageBatchRequestEntry, len(chunk))
	for k, o := range chunk {
		entries[k] = types.SendMessageBatchRequestEntry{
			Id: aws.String(strconv.Itoa(k)), MessageBody: o.in.MessageBody, MessageAttributes: o.in.MessageAttributes,
			MessageGroupId: o.in.MessageGroupId, MessageDeduplicationId: o.in.MessageDeduplicationId,
		}
	}
	out, err := p.client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(queue), Entries: entries})
	if err != nil {
		for _, o := range chunk {
			errs[o.i] = p.wrap(msgs[o.i], err)
		}
		return
	}
	answered := make([]bool, len(chunk))
	for _, ok := range out.Successful {
		if k, err := strconv.Atoi(aws.ToString(ok.Id)); err == nil && k >= 0 && k < len(chunk) {
			answered[k] = true
		}
	}
	for _, f := range out.Failed {
		k, err := strconv.Atoi(aws.ToString(f.Id))
		if err != nil || k < 0 || k >= len(chunk) {
			continue
		}
		answered[k] = true
		m := msgs[chunk[k].i]
		e := fmt.Errorf("idemsqs: send %q to %s: %s: %s", m.ID, queue, aws.ToString(f.Code), aws.ToString(f.Message))
		if f.SenderFault {
			e = outbox.PermanentError(e)
		} else {
			e = idem.Retryable(e) // SQS's own fault
		}
		errs[chunk[k].i] = e
	}
	for k, ok := range answered {
		if !ok {
			m := msgs[chunk[k].i]
			errs[chunk[k].i] = idem.Retryable(fmt.Errorf("idemsqs: send %q to %s: SendMessageBatch did not answer for the entry", m.ID, queue))
		}
	}
}

// sendEach sends a queue's messages one SendMessage each, up to ten at a
// time.
func (p *OutboxPublisher) sendEach(ctx context.Context, msgs []outbox.Message, out []outgoing, errs []error) {
	sem := make(chan struct{}, maxBatchEntries)
	var wg sync.WaitGroup
	for _, o := range out {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if _, err := p.client.SendMessage(ctx, o.in); err != nil {
				errs[o.i] = p.wrap(msgs[o.i], err)
			}
		})
	}
	wg.Wait()
}

// wrap names the message in a call's error, marks a missing queue as
// permanent and an outage as idem.Retryable.
func (p *OutboxPublisher) wrap(m outbox.Message, err error) error {
	err = fmt.Errorf("idemsqs: send %q to %s: %w", m.ID, m.Topic, err)
	var missing *types.QueueDoesNotExist
	var api smithy.APIError
	if errors.As(err, &missing) || (errors.As(err, &api) && (strings.Contains(api.ErrorCode(), "NonExistentQueue") || api.ErrorCode() == "QueueDoesNotExist")) {
		return outbox.PermanentError(err)
	}
	if errors.As(err, &api) && api.ErrorFault() == smithy.FaultClient && !strings.Contains(api.ErrorCode(), "Throttl") && api.ErrorCode() != "RequestThrottled" {
		return err // refused as the sender's fault: counts as an attempt
	}
	// No answer, a lost connection, a server fault, throttling: SQS is
	// away or busy, which the relay does not count as an attempt.
	return idem.Retryable(err)
}

// input builds the SendMessage request of m and its size as SQS counts
// it, or says why SQS could never accept it.
func (p *OutboxPublisher) input(m outbox.Message) (*sqs.SendMessageInput, int, error) {
	if err := idem.ValidateKey(m.ID); err != nil {
		return nil, 0, fmt.Errorf("idemsqs: outbox message id: %w", err)
	}
	if m.Topic == "" {
		return nil, 0, fmt.Errorf("idemsqs: outbox message %q has no queue URL (Message.Topic)", m.ID)
	}
	if err := validBody(m.Payload); err != nil {
		return nil, 0, fmt.Errorf("idemsqs: outbox message %q: %w", m.ID, err)
	}
	attrs := make(map[string]types.MessageAttributeValue, len(m.Headers))
	for k, v := range m.Headers {
		if k == AttrID {
			continue // the id is the message's own
		}
		if v == "" {
			return nil, 0, fmt.Errorf("idemsqs: outbox message %q: header %q is empty; SQS refuses an empty attribute value", m.ID, k)
		}
		attrs[k] = stringAttr(v)
	}
	group := m.Key
	if group == "" {
		group = p.cfg.DefaultGroupID
	}
	in, _, err := sendInput(m.Topic, Message{Body: string(m.Payload), ID: m.ID, GroupID: group, DeduplicationID: m.ID, Attributes: attrs})
	if err != nil {
		return nil, 0, err // too many attributes
	}
	size := len(m.Payload)
	for k, v := range in.MessageAttributes {
		size += len(k) + len(aws.ToString(v.DataType)) + len(aws.ToString(v.StringValue))
	}
	if size > p.cfg.MaxMessageBytes {
		return nil, 0, fmt.Errorf("idemsqs: outbox message %q is %d bytes with its attributes, over MaxMessageBytes %d", m.ID, size, p.cfg.MaxMessageBytes)
	}
	return in, size, nil
}

// validBody checks that b is a body SQS accepts: UTF-8 of #x9, #xA, #xD,
// #x20–#xD7FF, #xE000–#xFFFD and #x10000–#x10FFFF, and not empty.
func validBody(b []byte) error {
	if len(b) == 0 {
		return errors.New("empty payload; SQS refuses an empty message body")
	}
	if !utf8.Valid(b) {
		return errors.New("payload is not UTF-8; SQS carries text (encode binary payloads, e.g. base64)")
	}
	for off, r := range string(b) {
		switch {
		case r == 0x9, r == 0xA, r == 0xD, r >= 0x20 && r <= 0xD7FF, r >= 0xE000 && r <= 0xFFFD, r >= 0x10000 && r <= 0x10FFFF:
		default:
			return fmt.Errorf("payload has character %U at byte %d, which SQS does not allow in a message body", r, off)
		}
	}
	return nil
}
