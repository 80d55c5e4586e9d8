package idemsqs_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemsqs"
	"github.com/idem-go/idem/consume"
)

// Every message published three times is applied once, in batches (one
// ProcessBatch per receive) and one at a time.
func TestDuplicatesAppliedOnce(t *testing.T) {
	for _, batched := range []bool{true, false} {
		t.Run(fmt.Sprintf("batch=%v", batched), func(t *testing.T) {
			t.Parallel()
			c := sqsClient(t)
			q := newQueue(t, c, t.Name(), nil)
			dlq := newQueue(t, c, t.Name()+"-dlq", nil)
			l := newLedger(t)
			const n = 20
			for i := range n {
				for range 3 {
					publish(t, c, q, idemsqs.Message{Body: fmt.Sprintf("event-%d", i), ID: fmt.Sprintf("id-%d", i)})
				}
			}
			var counters consume.Counters
			cons := newConsumer(t, c, q, dlq, l.process(), func(cfg *idemsqs.Config) {
				cfg.Hooks = []idem.Hook{&counters}
				if batched {
					cfg.BatchProcess = l.batch()
				}
			})
			runConsumer(t, cons)
			waitFor(t, 30*time.Second, "every message deleted", func() bool { return queueDepth(t, c, q) == 0 })
			got := l.counts(t)
			if len(got) != n {
				t.Fatalf("%d events applied, want %d: %v", len(got), n, got)
			}
			for id, k := range got {
				if k != 1 {
					t.Errorf("%s applied %d times", id, k)
				}
			}
			s := counters.Snapshot()
			if s.Processed != n || s.Duplicate != 2*n {
				t.Errorf("counters %+v, want %d processed and %d duplicates", s, n, 2*n)
			}
		})
	}
}

// A message that always fails is retried through its visibility and then
// dead-lettered with its failure metadata as attributes; once fixed, a
// redrive sends it back and it is applied once.
func TestPoisonDeadLetteredAndRedriven(t *testing.T) {
	t.Parallel()
	c := sqsClient(t)
	q := newQueue(t, c, t.Name(), nil)
	dlq := newQueue(t, c, t.Name()+"-dlq", nil)
	var broken atomic.Bool
	broken.Store(true)
	var calls atomic.Int32
	process := func(ctx context.Context, msg idem.Message, d consume.Delivery) (idem.Outcome, error) {
		calls.Add(1)
		if broken.Load() {
			return "", errors.New("boom: poison")
		}
		return idem.Processed, nil
	}
	cons := newConsumer(t, c, q, dlq, process, func(cfg *idemsqs.Config) { cfg.Retry = fastRetry(2); cfg.Name = "poison-consumer" })
	runConsumer(t, cons)
	sent := publish(t, c, q, idemsqs.Message{Body: "poison", ID: "poison-1", Attributes: map[string]types.MessageAttributeValue{
		"tenant": {DataType: aws.String("String"), StringValue: aws.String("acme")},
	}})
	waitFor(t, 30*time.Second, "the dead letter", func() bool { return queueDepth(t, c, dlq) == 1 })
	if queueDepth(t, c, q) != 0 {
		t.Fatal("the original is still in the work queue")
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("handler ran %d times, want 2 (MaxAttempts)", n)
	}
	dead, err := idemsqs.ListDeadLetters(context.Background(), c, dlq, 10)
	if err != nil || len(dead) != 1 {
		t.Fatalf("ListDeadLetters: %v, %d messages", err, len(dead))
	}
	m := dead[0]
	if m.ID != "poison-1" || m.Reason != idem.DeadMaxAttempts || m.Attempts != 2 || m.Consumer != "poison-consumer" ||
		m.Origin != q || m.OriginalID == "" || m.FirstFailure.IsZero() || m.LastFailure.Before(m.FirstFailure) ||
		!strings.Contains(m.LastError, "boom: poison") || m.Attributes["tenant"] != "acme" || string(m.Body) != "poison" {
		t.Errorf("dead letter %+v", m)
	}
	if !strings.Contains(m.Report(time.Now()), "max_attempts after 2 attempt(s)") {
		t.Errorf("report: %s", m.Report(time.Now()))
	}
	_ = sent
	// Listing does not consume.
	if again, _ := idemsqs.ListDeadLetters(context.Background(), c, dlq, 10); len(again) != 1 {
		t.Fatalf("second listing found %d dead letters", len(again))
	}

	broken.Store(false)
	res, err := idemsqs.Redrive(context.Background(), c, dlq, nil, nil)
	if err != nil || !slices.Equal(res.Redriven, []string{"poison-1"}) {
		t.Fatalf("Redrive: %+v, %v", res, err)
	}
	waitFor(t, 30*time.Second, "the redriven message applied", func() bool { return calls.Load() == 3 && queueDepth(t, c, q) == 0 })
	if queueDepth(t, c, dlq) != 0 {
		t.Error("the dead letter is still there after the redrive")
	}
}

// The heartbeat keeps a message hidden while a handler outlives the
// queue's visibility timeout several times: a second consumer never gets it.
func TestVisibilityHeartbeat(t *testing.T) {
	t.Parallel()
	c := sqsClient(t)
	q := newQueue(t, c, t.Name(), map[string]string{"VisibilityTimeout": "3"})
	dlq := newQueue(t, c, t.Name()+"-dlq", nil)
	var calls, done atomic.Int32
	process := func(ctx context.Context, msg idem.Message, d consume.Delivery) (idem.Outcome, error) {
		calls.Add(1)
		select {
		case <-time.After(10 * time.Second): // 3⅓ visibility timeouts
		case <-ctx.Done():
			return "", ctx.Err()
		}
		done.Add(1)
		return idem.Processed, nil
	}
	for range 2 {
		runConsumer(t, newConsumer(t, c, q, dlq, process, func(cfg *idemsqs.Config) { cfg.Concurrency = 1 }))
	}
	publish(t, c, q, idemsqs.Message{Body: "slow"})
	waitFor(t, 30*time.Second, "the slow message deleted", func() bool { return done.Load() == 1 && queueDepth(t, c, q) == 0 })
	time.Sleep(4 * time.Second) // a lapsed visibility would redeliver it now
	if n := calls.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want 1", n)
	}
}

// On a FIFO queue every group's effects happen in order; a failing message
// holds back its own group only.
func TestFIFOOrderPerGroup(t *testing.T) {
	t.Parallel()
	c := sqsClient(t)
	q := newQueue(t, c, t.Name()+".fifo", map[string]string{"VisibilityTimeout": "5"})
	dlq := newQueue(t, c, t.Name()+"-dlq.fifo", nil)
	var (
		mu     sync.Mutex
		seen   = map[string][]string{}
		failed atomic.Bool
	)
	process := func(ctx context.Context, msg idem.Message, d consume.Delivery) (idem.Outcome, error) {
		body := string(d.Body())
		if body == "a-1" && failed.CompareAndSwap(false, true) {
			return "", errors.New("first try of a-1 fails")
		}
		mu.Lock()
		defer mu.Unlock()
		g := body[:1]
		if slices.Contains(seen[g], body) {
			return idem.Duplicate, nil
		}
		seen[g] = append(seen[g], body)
		return idem.Processed, nil
	}
	for i := range 5 {
		for _, g := range []string{"a", "b"} {
			publish(t, c, q, idemsqs.Message{Body: fmt.Sprintf("%s-%d", g, i), GroupID: g})
		}
	}
	runConsumer(t, newConsumer(t, c, q, dlq, process, func(cfg *idemsqs.Config) { cfg.Concurrency = 1 }))
	waitFor(t, 30*time.Second, "both groups applied", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen["a"]) == 5 && len(seen["b"]) == 5
	})
	mu.Lock()
	defer mu.Unlock()
	for _, g := range []string{"a", "b"} {
		for i, body := range seen[g] {
			if want := fmt.Sprintf("%s-%d", g, i); body != want {
				t.Errorf("group %s applied %v, want in order", g, seen[g])
				break
			}
		}
	}
	if !failed.Load() {
		t.Error("a-1 never failed")
	}
}

// Exercise 3 on SQS: ten identical publishes to a FIFO queue inside the
// deduplication window are one message, and the consumer applies it once.
func TestExercise3IdenticalPublishes(t *testing.T) {
	t.Parallel()
	c := sqsClient(t)
	q := newQueue(t, c, t.Name()+".fifo", nil)
	dlq := newQueue(t, c, t.Name()+"-dlq.fifo", nil)
	var first idemsqs.PublishResult
	for i := range 10 {
		res := publish(t, c, q, idemsqs.Message{Body: `{"order":42,"amount":100}`, GroupID: "orders"})
		if i == 0 {
			first = res
		}
		if res.ID != first.ID || res.DeduplicationID != first.ID || res.ID != idem.ContentID([]byte(`{"order":42,"amount":100}`)) {
			t.Fatalf("publish %d: %+v, want the content id as id and deduplication id", i, res)
		}
	}
	if n := queueDepth(t, c, q); n != 1 {
		t.Fatalf("%d messages in the queue after 10 identical publishes, want 1", n)
	}
	l := newLedger(t)
	runConsumer(t, newConsumer(t, c, q, dlq, l.process(), func(cfg *idemsqs.Config) { cfg.Concurrency = 1 }))
	waitFor(t, 30*time.Second, "the message applied", func() bool { return queueDepth(t, c, q) == 0 })
	if got := l.counts(t); len(got) != 1 || got[`{"order":42,"amount":100}`] != 1 {
		t.Errorf("ledger %v", got)
	}
}

func TestPingDeadAddress(t *testing.T) {
	t.Parallel()
	c := newClient("http://127.0.0.1:1")
	cons := newConsumer(t, c, "http://127.0.0.1:1/000000000000/nope", "http://127.0.0.1:1/000000000000/nope-dlq",
		func(context.Context, idem.Message, consume.Delivery) (idem.Outcome, error) {
			return idem.Processed, nil
		})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := cons.Ping(ctx)
	if err == nil || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("Ping = %v, want an error naming the queue", err)
	}
	if err := cons.Run(ctx); err == nil {
		t.Fatal("Run against a dead address returned nil")
	}
}

func TestPingMissingQueues(t *testing.T) {
	t.Parallel()
	c := sqsClient(t)
	q := newQueue(t, c, t.Name(), nil)
	ok := func(context.Context, idem.Message, consume.Delivery) (idem.Outcome, error) {
		return idem.Processed, nil
	}
	if err := newConsumer(t, c, q, q+"-missing", ok).Ping(context.Background()); err == nil || !strings.Contains(err.Error(), "dead-letter queue") {
		t.Errorf("Ping with a missing dead-letter queue = %v", err)
	}
	if err := newConsumer(t, c, q, "", ok).Ping(context.Background()); !errors.Is(err, idem.ErrInvalidConfig) || !strings.Contains(err.Error(), "no redrive policy") {
		t.Errorf("Ping without a dead-letter queue = %v", err)
	}
	slow := newConsumer(t, c, q, q, ok, func(cfg *idemsqs.Config) { cfg.Heartbeat = 30 * time.Second })
	if err := slow.Ping(context.Background()); !errors.Is(err, idem.ErrInvalidConfig) || !strings.Contains(err.Error(), "Heartbeat 30s is not shorter than the visibility timeout 30s") {
		t.Errorf("Ping with a heartbeat as long as the visibility timeout = %v", err)
	}
}

// The native redrive policy: its target is the default dead-letter queue,
// and a maxReceiveCount at or below max_attempts is refused.
func TestRedrivePolicy(t *testing.T) {
	t.Parallel()
	c := sqsClient(t)
	dlq := newQueue(t, c, t.Name()+"-dlq", nil)
	attrs, err := c.GetQueueAttributes(context.Background(), &sqs.GetQueueAttributesInput{QueueUrl: aws.String(dlq), AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn}})
	if err != nil {
		t.Fatal(err)
	}
	arn := attrs.Attributes["QueueArn"]
	ok := func(context.Context, idem.Message, consume.Delivery) (idem.Outcome, error) {
		return idem.Processed, nil
	}
	low := newQueue(t, c, t.Name()+"-low", map[string]string{"RedrivePolicy": fmt.Sprintf(`{"maxReceiveCount":"3","deadLetterTargetArn":"%s"}`, arn)})
	err = newConsumer(t, c, low, "", ok).Ping(context.Background())
	if !errors.Is(err, idem.ErrInvalidConfig) || !strings.Contains(err.Error(), "maxReceiveCount 3, not above max_attempts 3") {
		t.Errorf("Ping with maxReceiveCount 3 = %v", err)
	}
	high := newQueue(t, c, t.Name()+"-high", map[string]string{"RedrivePolicy": fmt.Sprintf(`{"maxReceiveCount":"10","deadLetterTargetArn":"%s"}`, arn)})
	if err := newConsumer(t, c, high, "", ok).Ping(context.Background()); err != nil {
		t.Errorf("Ping with maxReceiveCount 10 and the policy's dead-letter queue: %v", err)
	}
}

func TestNewConsumerErrors(t *testing.T) {
	c := newClient("http://127.0.0.1:1")
	ok := func(context.Context, idem.Message, consume.Delivery) (idem.Outcome, error) {
		return idem.Processed, nil
	}
	for name, cfg := range map[string]*idemsqs.Config{
		"no queue":     {Config: consume.Config{Name: "x"}, Process: ok},
		"no name":      {QueueURL: "http://h/1/q", Process: ok},
		"no process":   {Config: consume.Config{Name: "x"}, QueueURL: "http://h/1/q"},
		"fifo dlq":     {Config: consume.Config{Name: "x"}, QueueURL: "http://h/1/q.fifo", DeadLetterQueueURL: "http://h/1/d", Process: ok},
		"visibility":   {Config: consume.Config{Name: "x"}, QueueURL: "http://h/1/q", Process: ok, Visibility: 13 * time.Hour},
		"short window": {Config: consume.Config{Name: "x", Retention: time.Minute}, QueueURL: "http://h/1/q", Process: ok},
	} {
		if _, err := idemsqs.NewConsumer(c, cfg); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("%s: NewConsumer = %v, want ErrInvalidConfig", name, err)
		}
	}
	if _, err := idemsqs.NewConsumer(nil, &idemsqs.Config{}); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("nil client: %v", err)
	}
}

func TestPublishErrors(t *testing.T) {
	c := newClient("http://127.0.0.1:1")
	ctx := context.Background()
	if _, err := idemsqs.Publish(ctx, c, "http://h/1/q.fifo", idemsqs.Message{Body: "x"}); err == nil || !strings.Contains(err.Error(), "GroupID") {
		t.Errorf("FIFO without a group: %v", err)
	}
	if _, err := idemsqs.Publish(ctx, c, "http://h/1/q", idemsqs.Message{Body: "x", ID: "bad\x00id"}); !errors.Is(err, idem.ErrInvalidKey) {
		t.Errorf("invalid id: %v", err)
	}
	many := map[string]types.MessageAttributeValue{}
	for i := range 10 {
		many[fmt.Sprint("a", i)] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String("v")}
	}
	if _, err := idemsqs.Publish(ctx, c, "http://h/1/q", idemsqs.Message{Body: "x", Attributes: many}); err == nil || !strings.Contains(err.Error(), "allows 10") {
		t.Errorf("11 attributes: %v", err)
	}
	if _, err := idemsqs.Publish(ctx, c, "http://127.0.0.1:1/1/q", idemsqs.Message{Body: "x"}); err == nil {
		t.Error("publish to a dead address succeeded")
	}
}
