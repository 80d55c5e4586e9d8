package idemsqs

import (
	"context"
	"fmt"
	"maps"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/idem-go/idem"
)

// Message is a message for [Publish].
type Message struct {
	// Body is the payload. Required.
	Body string
	// ID is the producer's message id, sent as the AttrID attribute: the
	// consumer's dedupe key. Default: idem.ContentID(Body), so that two
	// publishes of the same bytes are one message to idem.
	ID string
	// GroupID is the FIFO MessageGroupId: messages of one group are
	// delivered, and applied, in order. Required on a FIFO queue.
	GroupID string
	// DeduplicationID is the FIFO MessageDeduplicationId. Default: the
	// message id (ID, or the SHA-256 of the body), so that SQS drops a
	// producer's retry within its five-minute window.
	DeduplicationID string
	// Attributes are further message attributes (SQS allows ten in all,
	// AttrID included).
	Attributes map[string]types.MessageAttributeValue
	// Delay is the send's DelaySeconds (standard queues), up to 15 minutes.
	Delay time.Duration
}

// PublishResult is SQS's answer to a publish.
type PublishResult struct {
	// ID is the AttrID that was sent; DeduplicationID the FIFO
	// MessageDeduplicationId ("" on a standard queue).
	ID, DeduplicationID string
	// MessageID is the MessageId SQS returned and SequenceNumber the FIFO
	// sequence number. SQS accepts a send whose DeduplicationID it saw in
	// the last five minutes and does not deliver it; its answer does not
	// say so, and the consumer deduplicates such a message by ID anyway.
	MessageID, SequenceNumber string
}

// Publish sends m to the queue at queueURL with its id in the AttrID
// attribute and, on a FIFO queue (a URL ending in ".fifo"), its
// MessageGroupId and MessageDeduplicationId.
func Publish(ctx context.Context, client *sqs.Client, queueURL string, m Message) (PublishResult, error) {
	in, res, err := sendInput(queueURL, m)
	if err != nil {
		return res, err
	}
	out, err := client.SendMessage(ctx, in)
	if err != nil {
		return res, fmt.Errorf("idemsqs: publish %q to %s: %w", res.ID, queueURL, err)
	}
	res.MessageID, res.SequenceNumber = aws.ToString(out.MessageId), aws.ToString(out.SequenceNumber)
	return res, nil
}

// sendInput builds the SendMessage request of [Publish].
func sendInput(queueURL string, m Message) (*sqs.SendMessageInput, PublishResult, error) {
	res := PublishResult{ID: m.ID}
	if res.ID == "" {
		res.ID = idem.ContentID([]byte(m.Body))
	}
	if err := idem.ValidateKey(res.ID); err != nil {
		return nil, res, fmt.Errorf("idemsqs: publish: %w", err)
	}
	attrs := make(map[string]types.MessageAttributeValue, len(m.Attributes)+1)
	maps.Copy(attrs, m.Attributes)
	attrs[AttrID] = stringAttr(res.ID)
	if len(attrs) > maxAttributes {
		return nil, res, fmt.Errorf("idemsqs: publish %q: %d message attributes with %s, SQS allows %d", res.ID, len(attrs), AttrID, maxAttributes)
	}
	in := &sqs.SendMessageInput{QueueUrl: aws.String(queueURL), MessageBody: aws.String(m.Body), MessageAttributes: attrs}
	if isFIFO(queueURL) {
		if m.GroupID == "" {
			return nil, res, fmt.Errorf("idemsqs: publish %q: FIFO queue %s needs a GroupID", res.ID, queueURL)
		}
		res.DeduplicationID = m.DeduplicationID
		if res.DeduplicationID == "" {
			res.DeduplicationID = res.ID
		}
		in.MessageGroupId, in.MessageDeduplicationId = aws.String(m.GroupID), aws.String(res.DeduplicationID)
	} else if m.Delay > 0 {
		in.DelaySeconds = int32(min(m.Delay, 15*time.Minute) / time.Second)
	}
	return in, res, nil
}
