package idemsqs

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/idem-go/idem/consume"
)

// AttrRedrives counts how many times a dead letter was redriven.
const AttrRedrives = "x-idem-redrives"

// ReasonMaxReceiveCount is the reason [ListDeadLetters] gives a message
// without idem's failure metadata: one the queue's native redrive policy
// moved after maxReceiveCount receives.
const ReasonMaxReceiveCount = "max_receive_count"

// DefaultMaxRedrives caps redrives of one message.
const DefaultMaxRedrives = 3

// DeadMessage is a dead letter with its failure context.
type DeadMessage struct {
	consume.DeadLetter
	// ID is the message's dedupe id (AttrID, else its deduplication id,
	// else OriginalID).
	ID string
	// OriginalID is the SQS MessageId of the message that was
	// dead-lettered; MessageID is the dead letter's own.
	OriginalID, MessageID string
	// Redrives is how many times it was redriven already.
	Redrives int
	// Attributes are every message attribute, as strings.
	Attributes map[string]string
	Body       []byte
	// Sent is when SQS received the dead letter (zero if not reported).
	Sent time.Time

	m types.Message
}

// Age is how long ago the message last failed (or was dead-lettered).
func (m DeadMessage) Age(now time.Time) time.Duration {
	switch {
	case !m.LastFailure.IsZero():
		return now.Sub(m.LastFailure)
	case !m.Sent.IsZero():
		return now.Sub(m.Sent)
	}
	return 0
}

func parseDeadMessage(m types.Message) DeadMessage {
	get := func(n string) (string, bool) { return attr(m.MessageAttributes, n) }
	d := DeadMessage{
		DeadLetter: consume.ParseDeadLetter(get),
		MessageID:  aws.ToString(m.MessageId),
		Body:       []byte(aws.ToString(m.Body)),
		Attributes: map[string]string{},
		m:          m,
	}
	for k, v := range m.MessageAttributes {
		if v.StringValue != nil {
			d.Attributes[k] = *v.StringValue
		} else {
			d.Attributes[k] = fmt.Sprintf("(%s, %d bytes)", aws.ToString(v.DataType), len(v.BinaryValue))
		}
	}
	d.OriginalID, _ = get(AttrOriginalID)
	if d.OriginalID == "" {
		d.OriginalID = d.MessageID // moved by SQS's own redrive policy
	}
	d.ID, _ = get(AttrID)
	if d.ID == "" {
		d.ID = m.Attributes[string(types.MessageSystemAttributeNameMessageDeduplicationId)]
	}
	if d.ID == "" {
		d.ID = d.OriginalID
	}
	if v, ok := get(AttrRedrives); ok {
		d.Redrives, _ = strconv.Atoi(v)
	}
	if ms, err := strconv.ParseInt(m.Attributes[string(types.MessageSystemAttributeNameSentTimestamp)], 10, 64); err == nil {
		d.Sent = time.UnixMilli(ms)
	}
	if d.Reason == "" {
		// Moved by the queue's native redrive policy, not by idem.
		d.Reason = ReasonMaxReceiveCount
	}
	return d
}

// listVisibility hides the messages a scan has read until it is done, so
// that it does not read them twice.
const listVisibility = 30 * time.Second

// scan receives up to limit distinct messages of the queue at url, calls
// fn for each and then makes every message fn did not consume visible
// again. fn returns whether it consumed (deleted) the message. It stops
// after two receives in a row bring nothing new: one empty long poll can
// be a false empty (seen from goaws on a loaded machine).
func scan(ctx context.Context, client *sqs.Client, url string, limit int, fn func(DeadMessage) (bool, error)) (err error) {
	var keep []types.Message
	defer func() {
		if rerr := release(ctx, client, url, keep); rerr != nil && err == nil {
			err = rerr
		}
	}()
	seen := map[string]bool{}
	for empties := 0; len(seen) < limit && empties < 2; {
		out, err := client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl:                    aws.String(url),
			MaxNumberOfMessages:         int32(min(10, limit-len(seen))),
			VisibilityTimeout:           int32(listVisibility / time.Second),
			WaitTimeSeconds:             1,
			MessageAttributeNames:       []string{"All"},
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
		})
		if err != nil {
			return fmt.Errorf("idemsqs: read %s: %w", url, err)
		}
		fresh := 0
		for _, m := range out.Messages {
			id := aws.ToString(m.MessageId)
			if seen[id] {
				keep = append(keep, m)
				continue
			}
			seen[id] = true
			fresh++
			consumed, err := fn(parseDeadMessage(m))
			if !consumed {
				keep = append(keep, m)
			}
			if err != nil {
				return err
			}
		}
		if fresh == 0 {
			empties++
		} else {
			empties = 0
		}
	}
	return nil
}

// release makes the messages a scan kept visible again, trying each up to
// three times; the error says how many stay hidden.
func release(ctx context.Context, client *sqs.Client, url string, msgs []types.Message) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	var failed int
	var last error
	for _, m := range msgs {
		for try := range 3 {
			_, err := client.ChangeMessageVisibility(rctx, &sqs.ChangeMessageVisibilityInput{QueueUrl: aws.String(url), ReceiptHandle: m.ReceiptHandle, VisibilityTimeout: 0})
			if err == nil {
				break
			}
			if try == 2 {
				failed, last = failed+1, err
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if failed > 0 {
		return fmt.Errorf("idemsqs: %d message(s) of %s stay hidden for up to %v: %w", failed, url, listVisibility, last)
	}
	return nil
}

// ListDeadLetters returns up to limit messages of the dead-letter queue at
// url with their failure context, without consuming them: they are hidden
// while being read and made visible again at the end. Each read counts as
// a receive of the message for SQS.
func ListDeadLetters(ctx context.Context, client *sqs.Client, url string, limit int) ([]DeadMessage, error) {
	if limit <= 0 {
		limit = 100
	}
	var out []DeadMessage
	err := scan(ctx, client, url, limit, func(m DeadMessage) (bool, error) {
		out = append(out, m)
		return false, nil
	})
	return out, err
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
}

// Redrive sends the dead letters of the queue at url that match back to
// the queue they were first sent to (the consume.HeaderOrigin attribute),
// with their body and the producer's attributes, the failure metadata
// cleared (so they get a fresh set of attempts) and AttrRedrives
// incremented; on a FIFO origin with their group and a deduplication id
// derived from the dead letter. Each is deleted from the dead letters only
// after the send succeeded. It is a manual operation: run it after fixing
// what made the messages fail.
func Redrive(ctx context.Context, client *sqs.Client, url string, match func(DeadMessage) bool, opts *RedriveOptions) (RedriveResult, error) {
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
	err := scan(ctx, client, url, o.Limit, func(m DeadMessage) (bool, error) {
		if match != nil && !match(m) {
			return false, nil
		}
		if m.Redrives >= o.MaxRedrives {
			res.Capped = append(res.Capped, m.ID)
			return false, nil
		}
		if m.Origin == "" {
			return false, fmt.Errorf("idemsqs: message %q has no %s attribute to redrive it to", m.ID, consume.HeaderOrigin)
		}
		in := &sqs.SendMessageInput{QueueUrl: aws.String(m.Origin), MessageBody: m.m.Body, MessageAttributes: map[string]types.MessageAttributeValue{}}
		for k, v := range m.m.MessageAttributes {
			if !strings.HasPrefix(k, "x-idem-") || k == consume.HeaderOrigin {
				in.MessageAttributes[k] = v
			}
		}
		in.MessageAttributes[AttrRedrives] = stringAttr(strconv.Itoa(m.Redrives + 1))
		if isFIFO(m.Origin) {
			g := m.m.Attributes[string(types.MessageSystemAttributeNameMessageGroupId)]
			if g == "" {
				g = m.ID
			}
			in.MessageGroupId = aws.String(g)
			in.MessageDeduplicationId = aws.String(fmt.Sprintf("idem-redrive:%s:%d", m.MessageID, m.Redrives+1))
		}
		if _, err := client.SendMessage(ctx, in); err != nil {
			return false, fmt.Errorf("idemsqs: redrive %q to %s: %w", m.ID, m.Origin, err)
		}
		if _, err := client.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(url), ReceiptHandle: m.m.ReceiptHandle}); err != nil {
			return false, fmt.Errorf("idemsqs: delete %q after redrive: %w", m.ID, err)
		}
		res.Redriven = append(res.Redriven, m.ID)
		return true, nil
	})
	return res, err
}

// MoveBack asks SQS to move every message of the dead-letter queue at url
// back to the queue it came from, with StartMessageMoveTask (SQS's own
// redrive, for a dead-letter queue of a redrive policy), and returns the
// task's handle. Unlike [Redrive] it neither filters nor caps and keeps the
// messages' attributes as they are (the consumer does not read retry state
// from attributes; it counts a moved message's attempts from its receive
// count, as SQS keeps it). Servers without message move tasks
// (goaws) answer with an error: use Redrive there.
func MoveBack(ctx context.Context, client *sqs.Client, url string) (string, error) {
	attrs, err := client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl: aws.String(url), AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn},
	})
	if err != nil {
		return "", fmt.Errorf("idemsqs: queue %s: %w", url, err)
	}
	arn := attrs.Attributes[string(types.QueueAttributeNameQueueArn)]
	if arn == "" {
		return "", fmt.Errorf("idemsqs: queue %s: the server reports no QueueArn", url)
	}
	out, err := client.StartMessageMoveTask(ctx, &sqs.StartMessageMoveTaskInput{SourceArn: aws.String(arn)})
	if err != nil {
		return "", fmt.Errorf("idemsqs: start message move task from %s: %w", arn, err)
	}
	return aws.ToString(out.TaskHandle), nil
}

// Purge deletes every message of the queue at url (PurgeQueue; SQS may
// take up to a minute and allows one purge a minute).
func Purge(ctx context.Context, client *sqs.Client, url string) error {
	if _, err := client.PurgeQueue(ctx, &sqs.PurgeQueueInput{QueueUrl: aws.String(url)}); err != nil {
		return fmt.Errorf("idemsqs: purge %s: %w", url, err)
	}
	return nil
}

// Report describes the dead letter for a person: why it failed, how often,
// when and where it came from.
func (m DeadMessage) Report(now time.Time) string {
	var b []byte
	b = fmt.Appendf(b, "message %q (SQS id %s): %s after %d attempt(s)", m.ID, orDash(m.OriginalID), orDash(string(m.Reason)), m.Attempts)
	if m.Consumer != "" {
		b = fmt.Appendf(b, " in consumer %q", m.Consumer)
	}
	b = fmt.Appendf(b, "\n  origin: %s\n", orDash(m.Origin))
	if !m.FirstFailure.IsZero() {
		b = fmt.Appendf(b, "  failures: first %s, last %s (%s ago)\n",
			m.FirstFailure.UTC().Format(time.RFC3339), m.LastFailure.UTC().Format(time.RFC3339), m.Age(now).Round(time.Second))
	}
	b = fmt.Appendf(b, "  last error: %s\n", orDash(m.LastError))
	if m.Redrives > 0 {
		b = fmt.Appendf(b, "  redriven %d time(s)\n", m.Redrives)
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
