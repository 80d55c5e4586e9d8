package idemsqs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/retry"
)

func testConsumer(t *testing.T, url string, retention time.Duration) *Consumer {
	t.Helper()
	c, err := NewConsumer(sqs.New(sqs.Options{Region: "us-east-1"}), &Config{
		Config:   consume.Config{Name: "c", Retention: retention, Retry: &retry.Policy{Base: time.Second, Cap: time.Minute, MaxAttempts: 5}},
		QueueURL: url,
		Process: func(_ context.Context, _ idem.Message, _ consume.Delivery) (idem.Outcome, error) {
			return idem.Processed, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestParseQueueInfo(t *testing.T) {
	info, err := parseQueueInfo("u.fifo", map[string]string{
		"VisibilityTimeout": "30", "MessageRetentionPeriod": "345600",
		"RedrivePolicy": `{"deadLetterTargetArn":"arn:aws:sqs:eu-west-1:1:d.fifo","maxReceiveCount":10}`,
	})
	want := QueueInfo{FIFO: true, Visibility: 30 * time.Second, Retention: 96 * time.Hour, MaxReceiveCount: 10, DeadLetterTargetARN: "arn:aws:sqs:eu-west-1:1:d.fifo"}
	if err != nil || info != want {
		t.Errorf("parseQueueInfo = %+v, %v; want %+v", info, err, want)
	}
	for name, a := range map[string]map[string]string{
		"visibility": {"VisibilityTimeout": "soon"},
		"retention":  {"MessageRetentionPeriod": "-1"},
		"redrive":    {"RedrivePolicy": "{"},
		"count":      {"RedrivePolicy": `{"maxReceiveCount":"many"}`},
	} {
		if _, err := parseQueueInfo("u", a); err == nil {
			t.Errorf("%s: no error for %v", name, a)
		}
	}
}

func TestWindowCheck(t *testing.T) {
	c := testConsumer(t, "u", 24*time.Hour)
	// 5 receives × 30s + 5 × 1m = 7m30s.
	if err := c.check(QueueInfo{Visibility: 30 * time.Second, Retention: 4 * 24 * time.Hour}, 30*time.Second); err != nil {
		t.Errorf("a 4-day queue: %v", err)
	}
	err := c.check(QueueInfo{Retention: 5 * time.Minute}, 30*time.Second)
	if !errors.Is(err, idem.ErrInvalidConfig) || !strings.Contains(err.Error(), "keeps messages 5m0s (MessageRetentionPeriod), shorter than the redelivery horizon 7m30s") {
		t.Errorf("a 5-minute queue: %v", err)
	}
	short := testConsumer(t, "u.fifo", 10*time.Minute)
	err = short.check(QueueInfo{FIFO: true, MaxReceiveCount: 10}, 30*time.Second)
	// 10 × 30s + 5 × 1m + 5m = 15m.
	if !errors.Is(err, idem.ErrInvalidConfig) || !strings.Contains(err.Error(), "redelivery horizon 15m0s (maxReceiveCount 10 × visibility 30s + max_attempts 5 × max_backoff 1m0s + FIFO deduplication window 5m0s)") {
		t.Errorf("a 10-minute retention on FIFO: %v", err)
	}
	err = c.check(QueueInfo{MaxReceiveCount: 5}, 30*time.Second)
	if !errors.Is(err, idem.ErrInvalidConfig) || !strings.Contains(err.Error(), "maxReceiveCount 5, not above max_attempts 5") {
		t.Errorf("maxReceiveCount 5: %v", err)
	}
}

func TestQueueURLFromARNRejects(t *testing.T) {
	if _, err := queueURLFromARN(t.Context(), sqs.New(sqs.Options{}), "arn:aws:sns:r:1:topic"); err == nil || !strings.Contains(err.Error(), "not an SQS queue ARN") {
		t.Errorf("an SNS ARN: %v", err)
	}
}

// A dead letter keeps the metadata and the id within SQS's ten attributes;
// the producer's other attributes fill the rest.
func TestDeadLetterAttributesLimit(t *testing.T) {
	m := types.Message{MessageId: aws.String("m-1"), MessageAttributes: map[string]types.MessageAttributeValue{AttrID: stringAttr("id-1")}}
	for i := range 9 {
		m.MessageAttributes[fmt.Sprint("user-", i)] = stringAttr("v")
	}
	now := time.Now()
	dl := consume.DeadLetter{State: consume.State{Attempts: 5, FirstFailure: now, LastFailure: now, LastError: "boom"}, Reason: idem.DeadMaxAttempts, Consumer: "c"}
	got := deadLetterAttributes(m, dl, "origin", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if len(got) != maxAttributes {
		t.Fatalf("%d attributes, want %d", len(got), maxAttributes)
	}
	for _, k := range []string{AttrID, AttrOriginalID, consume.HeaderReason, consume.HeaderAttempts, consume.HeaderFirstFailure,
		consume.HeaderLastFailure, consume.HeaderLastError, consume.HeaderConsumer, consume.HeaderOrigin} {
		if _, ok := got[k]; !ok {
			t.Errorf("missing %s", k)
		}
	}
}
