package idemsqs_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemsqs"
	"github.com/idem-go/idem/outbox"
)

func outboxPublisher(t *testing.T, c *sqs.Client, cfg *idemsqs.OutboxConfig) *idemsqs.OutboxPublisher {
	t.Helper()
	p, err := idemsqs.NewOutboxPublisher(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func noErrors(t *testing.T, errs []error, n int) {
	t.Helper()
	if len(errs) != n {
		t.Fatalf("%d errors for %d messages", len(errs), n)
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
}

// receiveAll receives (and deletes) want messages from queue, with their
// attributes.
func receiveAll(t *testing.T, c *sqs.Client, queue string, want int) []types.Message {
	t.Helper()
	var out []types.Message
	// Longer than goaws's visibility timeout (30 s in .ci/run's config):
	// goaws can hand messages to a long poll that has already returned
	// empty, which hides them until that timeout ends.
	deadline := time.Now().Add(90 * time.Second)
	for len(out) < want && time.Now().Before(deadline) {
		r, err := c.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{
			QueueUrl: aws.String(queue), MaxNumberOfMessages: 10, WaitTimeSeconds: 1,
			MessageAttributeNames:       []string{"All"},
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range r.Messages {
			out = append(out, m)
			if _, err := c.DeleteMessage(context.Background(), &sqs.DeleteMessageInput{QueueUrl: aws.String(queue), ReceiptHandle: m.ReceiptHandle}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(out) != want {
		t.Fatalf("received %d messages from %s, want %d", len(out), queue, want)
	}
	return out
}

// runPrefix makes the ids and bodies of one run's events its own: goaws
// (EnableDuplicates) drops a message whose id or body it saw within its
// deduplication window, also one sent by an earlier run of the test.
func runPrefix(name string) string {
	return fmt.Sprintf("%s-%d", name, time.Now().UnixNano())
}

func events(queue string, n int, prefix string) []outbox.Message {
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{ID: fmt.Sprintf("%s-%02d", prefix, i), Topic: queue, Key: fmt.Sprintf("order-%d", i%3),
			Payload: fmt.Appendf(nil, `{"event":%q,"n":%d}`, prefix, i), Headers: map[string]string{"kind": "created"}}
	}
	return msgs
}

// TestOutboxPublishBatches: 25 events to a standard queue go out in
// SendMessageBatch calls of at most ten, each confirmed.
func TestOutboxPublishBatches(t *testing.T) {
	t.Parallel()
	c := sqsClient(t)
	q := newQueue(t, c, t.Name(), nil)
	p := outboxPublisher(t, c, nil)
	msgs := events(q, 25, runPrefix("std"))
	noErrors(t, p.Publish(context.Background(), msgs), len(msgs))
	got := map[string]bool{}
	for _, m := range receiveAll(t, c, q, len(msgs)) {
		got[aws.ToString(m.Body)] = true
	}
	for _, m := range msgs {
		if !got[string(m.Payload)] {
			t.Fatalf("%s never arrived", m.ID)
		}
	}
	if errs := p.Publish(context.Background(), nil); len(errs) != 0 {
		t.Fatalf("empty batch: %v", errs)
	}
}

// TestOutboxPublishFIFO: on a FIFO queue the deduplication id is the
// event id: a batch published again (the relay crashed before marking it
// sent) is confirmed and dropped by SQS. (goaws does not report a FIFO
// message's group and deduplication id on receive; TestOutboxEntryResults
// checks what is sent.)
func TestOutboxPublishFIFO(t *testing.T) {
	t.Parallel()
	c := sqsClient(t)
	q := newQueue(t, c, t.Name()+".fifo", nil)
	p := outboxPublisher(t, c, nil)
	msgs := events(q, 12, runPrefix("fifo"))
	msgs[11].Key = "" // the default group
	noErrors(t, p.Publish(context.Background(), msgs), len(msgs))
	noErrors(t, p.Publish(context.Background(), msgs), len(msgs))
	if n := queueDepth(t, c, q); n != len(msgs) {
		t.Fatalf("queue holds %d messages after the repeat, want %d", n, len(msgs))
	}
	seen := map[string]bool{}
	for _, m := range receiveAll(t, c, q, len(msgs)) {
		seen[aws.ToString(m.Body)] = true
	}
	if len(seen) != len(msgs) {
		t.Fatalf("%d distinct bodies, want %d", len(seen), len(msgs))
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// TestOutboxOneByOneTakesEffectOnce: with OneByOne (goaws drops the
// attributes of batch entries) the id attribute arrives, and a batch
// published twice to a standard queue takes effect once through an idem
// consumer.
func TestOutboxOneByOneTakesEffectOnce(t *testing.T) {
	t.Parallel()
	c := sqsClient(t)
	q := newQueue(t, c, t.Name(), nil)
	dlq := newQueue(t, c, t.Name()+"-dlq", nil)
	p := outboxPublisher(t, c, &idemsqs.OutboxConfig{OneByOne: true})
	msgs := events(q, 15, runPrefix("once"))
	for i := range msgs {
		msgs[i].Payload = []byte(msgs[i].ID) // the ledger credits the body
	}
	noErrors(t, p.Publish(context.Background(), msgs), len(msgs))
	for _, m := range receiveAll(t, c, q, len(msgs)) {
		if id := aws.ToString(m.MessageAttributes[idemsqs.AttrID].StringValue); id != aws.ToString(m.Body) {
			t.Fatalf("message %s: %s attribute %q", aws.ToString(m.Body), idemsqs.AttrID, id)
		}
		if k := aws.ToString(m.MessageAttributes["kind"].StringValue); k != "created" {
			t.Fatalf("message %s: kind %q", aws.ToString(m.Body), k)
		}
	}
	noErrors(t, p.Publish(context.Background(), msgs), len(msgs))
	noErrors(t, p.Publish(context.Background(), msgs), len(msgs))
	l := newLedger(t)
	runConsumer(t, newConsumer(t, c, q, dlq, l.process()))
	waitFor(t, 60*time.Second, "every event applied and the queue drained", func() bool {
		return len(l.counts(t)) == len(msgs) && queueDepth(t, c, q) == 0
	})
	for id, n := range l.counts(t) {
		if n != 1 {
			t.Fatalf("%s applied %d times", id, n)
		}
	}
}

// TestOutboxPermanentErrors: what SQS can never accept is permanent, per
// message, and the rest goes out.
func TestOutboxPermanentErrors(t *testing.T) {
	t.Parallel()
	c := sqsClient(t)
	q := newQueue(t, c, t.Name(), nil)
	p := outboxPublisher(t, c, &idemsqs.OutboxConfig{MaxMessageBytes: 4096})
	missing := q[:strings.LastIndex(q, "/")+1] + "idemtest-missing-" + suffix()
	many := map[string]string{}
	for i := range 10 {
		many[fmt.Sprintf("h%d", i)] = "v"
	}
	msgs := []outbox.Message{
		{ID: "ok-1", Topic: q, Payload: []byte("fine")},
		{ID: "no-queue", Topic: missing, Payload: []byte("x")},
		{ID: "too-big", Topic: q, Payload: []byte(strings.Repeat("x", 5000))},
		{ID: "not-utf8", Topic: q, Payload: []byte{0xff, 0xfe}},
		{ID: "nul", Topic: q, Payload: []byte("a\x00b")},
		{ID: "empty", Topic: q},
		{ID: "eleven-attributes", Topic: q, Payload: []byte("x"), Headers: many},
		{ID: "empty-header", Topic: q, Payload: []byte("x"), Headers: map[string]string{"a": ""}},
		{ID: "", Topic: q, Payload: []byte("x")},
		{ID: "no-topic", Payload: []byte("x")},
		{ID: "ok-2", Topic: q, Payload: []byte("fine")},
	}
	errs := p.Publish(context.Background(), msgs)
	if len(errs) != len(msgs) {
		t.Fatalf("%d errors for %d messages", len(errs), len(msgs))
	}
	for i, m := range msgs {
		if strings.HasPrefix(m.ID, "ok-") {
			if errs[i] != nil {
				t.Errorf("%s: %v", m.ID, errs[i])
			}
			continue
		}
		if !outbox.Permanent(errs[i]) || !strings.HasPrefix(fmt.Sprint(errs[i]), "idemsqs: ") {
			t.Errorf("%q: %v, want a permanent idemsqs error", m.ID, errs[i])
		}
	}
	if !errors.Is(errs[8], idem.ErrInvalidKey) {
		t.Errorf("empty id: %v", errs[8])
	}
	receiveAll(t, c, q, 2)
}

// TestOutboxServerDown: with nothing listening every message gets a
// retryable error within AckTimeout.
func TestOutboxServerDown(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close() // nothing listens there any more
	p := outboxPublisher(t, newClient(url), &idemsqs.OutboxConfig{AckTimeout: 5 * time.Second})
	for _, oneByOne := range []bool{false, true} {
		if oneByOne {
			p = outboxPublisher(t, newClient(url), &idemsqs.OutboxConfig{AckTimeout: 5 * time.Second, OneByOne: true})
		}
		msgs := events(url+"/000000000000/orders", 12, "down")
		for i, err := range p.Publish(context.Background(), msgs) {
			if err == nil || outbox.Permanent(err) || !idem.IsRetryable(err) {
				t.Fatalf("one by one %v, message %d: %v, want an idem.Retryable error", oneByOne, i, err)
			}
		}
	}
}

// sentEntry is what the fake reads of a SendMessageBatch entry.
type sentEntry struct {
	Id, MessageBody, MessageGroupId, MessageDeduplicationId string
	MessageAttributes                                       map[string]struct{ DataType, StringValue string }
}

// fakeBatch answers SendMessageBatch in the AWS JSON 1.0 protocol, as the
// SQS API reference describes it: entry 1 fails as the sender's fault,
// entry 2 as the server's, entry 3 is not mentioned at all.
func fakeBatch(t *testing.T, calls *int, sent *[]sentEntry) *sqs.Client {
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		*calls++
		mu.Unlock()
		var in struct{ Entries []sentEntry }
		json.NewDecoder(r.Body).Decode(&in)
		mu.Lock()
		*sent = append(*sent, in.Entries...)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		if r.Header.Get("X-Amz-Target") != "AmazonSQS.SendMessageBatch" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		out := map[string]any{"Successful": []any{}, "Failed": []any{}}
		for _, e := range in.Entries {
			switch e.Id {
			case "1":
				out["Failed"] = append(out["Failed"].([]any), map[string]any{"Id": e.Id, "Code": "InvalidParameterValue", "Message": "bad attribute", "SenderFault": true})
			case "2":
				out["Failed"] = append(out["Failed"].([]any), map[string]any{"Id": e.Id, "Code": "InternalError", "Message": "try again", "SenderFault": false})
			case "3":
			default:
				out["Successful"] = append(out["Successful"].([]any), map[string]any{"Id": e.Id, "MessageId": "m-" + e.Id, "MD5OfMessageBody": "x"})
			}
		}
		json.NewEncoder(w).Encode(out)
	}))
	t.Cleanup(srv.Close)
	return sqs.New(sqs.Options{Region: "us-east-1", BaseEndpoint: aws.String(srv.URL),
		Credentials: credentials.NewStaticCredentialsProvider("idem", "idem", ""),
		// The fake does not compute body checksums.
		DisableMessageChecksumValidation: true})
}

// TestOutboxEntryResults: each entry's result is its message's: a
// sender's fault is permanent, a server's fault retryable, an entry SQS
// did not answer for retryable; 23 messages are three calls.
func TestOutboxEntryResults(t *testing.T) {
	var calls int
	var sent []sentEntry
	p := outboxPublisher(t, fakeBatch(t, &calls, &sent), nil)
	msgs := events("https://sqs.us-east-1.amazonaws.com/123456789012/orders.fifo", 23, "e")
	msgs[22].Key = ""
	errs := p.Publish(context.Background(), msgs)
	if calls != 3 || len(sent) != len(msgs) {
		t.Fatalf("%d SendMessageBatch calls, %d entries for 23 messages, want 3 and 23", calls, len(sent))
	}
	for i, e := range sent {
		m := msgs[i]
		if e.MessageBody != string(m.Payload) || e.MessageGroupId != cmpOr(m.Key, "idem-outbox") || e.MessageDeduplicationId != m.ID ||
			e.MessageAttributes[idemsqs.AttrID].StringValue != m.ID || e.MessageAttributes["kind"].StringValue != "created" {
			t.Fatalf("entry %d: %+v for %+v", i, e, m)
		}
	}
	for i, err := range errs {
		switch i % 10 {
		case 1:
			if !outbox.Permanent(err) || !strings.Contains(err.Error(), "bad attribute") {
				t.Errorf("message %d: %v, want permanent", i, err)
			}
		case 2, 3:
			if err == nil || outbox.Permanent(err) || !idem.IsRetryable(err) {
				t.Errorf("message %d: %v, want retryable", i, err)
			}
		default:
			if err != nil {
				t.Errorf("message %d: %v", i, err)
			}
		}
	}
}

func TestNewOutboxPublisherConfig(t *testing.T) {
	if _, err := idemsqs.NewOutboxPublisher(nil, nil); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("nil client: %v", err)
	}
	c := newClient("http://127.0.0.1:1")
	for _, cfg := range []*idemsqs.OutboxConfig{{MaxMessageBytes: 100}, {MaxMessageBytes: 2 << 20}, {AckTimeout: -1}} {
		if _, err := idemsqs.NewOutboxPublisher(c, cfg); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Fatalf("%+v: %v", cfg, err)
		}
	}
}

// TestOutboxBatchBytes: a SendMessageBatch call stays within
// MaxMessageBytes, however few entries that leaves it.
func TestOutboxBatchBytes(t *testing.T) {
	var calls int
	var sent []sentEntry
	p := outboxPublisher(t, fakeBatch(t, &calls, &sent), &idemsqs.OutboxConfig{MaxMessageBytes: 4096})
	msgs := events("https://sqs.us-east-1.amazonaws.com/123456789012/orders", 5, "b")
	for i := range msgs {
		msgs[i].Payload = []byte(strings.Repeat("x", 1500))
	}
	if errs := p.Publish(context.Background(), msgs); len(errs) != len(msgs) {
		t.Fatalf("%d errors for %d messages", len(errs), len(msgs))
	}
	if calls != 3 || len(sent) != len(msgs) {
		t.Fatalf("%d calls with %d entries, want 3 calls (2, 2, 1) for 5 messages of 1,500 bytes under 4,096", calls, len(sent))
	}
}
