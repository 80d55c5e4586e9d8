package idemsqs_test

import (
	"context"
	"fmt"
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

// BenchmarkConsume measures messages/s out of the same SQS-compatible
// server: a raw receive/delete loop (no dedupe, no effect: the server's
// ceiling) against the idem consumer applying each message to SQLite, one
// ProcessBatch and one DeleteMessageBatch per receive of ten.
func BenchmarkConsume(b *testing.B) {
	for _, mode := range []string{"raw-receive-delete", "idem-batch-sqlite"} {
		b.Run(mode, func(b *testing.B) {
			c := sqsClient(b)
			q := newQueue(b, c, b.Name(), nil)
			dlq := newQueue(b, c, b.Name()+"-dlq", nil)
			fill(b, c, q, b.N)
			b.ResetTimer()
			start := time.Now()
			elapsed := time.Duration(0)
			if mode == "raw-receive-delete" {
				elapsed = rawDrain(b, c, q, b.N)
			} else {
				l := newLedger(b)
				var counters consume.Counters
				cons := newConsumer(b, c, q, dlq, l.process(), func(cfg *idemsqs.Config) {
					cfg.BatchProcess = l.batch()
					cfg.Concurrency = 4
					cfg.Hooks = []idem.Hook{&counters}
				})
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				go func() { done <- cons.Run(ctx) }()
				for counters.Snapshot().Processed < int64(b.N) {
					time.Sleep(2 * time.Millisecond)
				}
				elapsed = time.Since(start)
				cancel()
				<-done
			}
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
		})
	}
}

// fill publishes n distinct messages with 8 senders.
func fill(b *testing.B, c *sqs.Client, q string, n int) {
	var wg sync.WaitGroup
	var next atomic.Int64
	for range 8 {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(n); i = next.Add(1) - 1 {
				if _, err := idemsqs.Publish(context.Background(), c, q, idemsqs.Message{Body: fmt.Sprintf("bench-%d", i)}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// rawDrain receives and deletes n messages with 4 loops, as a consumer
// without idem would, and returns how long it took until the last delete
// (not counting the other loops' last long poll).
func rawDrain(b *testing.B, c *sqs.Client, q string, n int) time.Duration {
	var wg sync.WaitGroup
	var got atomic.Int64
	start := time.Now()
	var elapsed atomic.Int64
	for range 4 {
		wg.Go(func() {
			for got.Load() < int64(n) {
				out, err := c.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{QueueUrl: aws.String(q), MaxNumberOfMessages: 10, WaitTimeSeconds: 1})
				if err != nil {
					b.Error(err)
					return
				}
				if len(out.Messages) == 0 {
					continue
				}
				entries := make([]types.DeleteMessageBatchRequestEntry, len(out.Messages))
				for i, m := range out.Messages {
					entries[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(fmt.Sprint(i)), ReceiptHandle: m.ReceiptHandle}
				}
				if _, err := c.DeleteMessageBatch(context.Background(), &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(q), Entries: entries}); err != nil {
					b.Error(err)
					return
				}
				if got.Add(int64(len(out.Messages))) >= int64(n) {
					elapsed.CompareAndSwap(0, int64(time.Since(start)))
				}
			}
		})
	}
	wg.Wait()
	return time.Duration(elapsed.Load())
}
