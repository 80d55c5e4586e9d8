package idemkafka_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemkafka"
	"github.com/idem-go/idem/outbox"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

func outboxPublisher(t *testing.T, cl *kgo.Client, cfg *idemkafka.OutboxConfig) *idemkafka.OutboxPublisher {
	t.Helper()
	p, err := idemkafka.NewOutboxPublisher(cl, cfg)
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

// TestOutboxPublish: records carry the id header, the key and the
// headers; the events of one key land on one partition in order; a batch
// published twice (a relay that crashed before marking it sent) is in the
// log twice and takes effect once through an idem consumer.
func TestOutboxPublish(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4)
	p := outboxPublisher(t, e.client(t), nil)
	var msgs []outbox.Message
	for i := range 60 {
		msgs = append(msgs, outbox.Message{
			ID: fmt.Sprintf("evt-%03d", i), Topic: e.topic, Key: fmt.Sprintf("order-%d", i%3),
			Payload: fmt.Appendf(nil, "%d", i), Headers: map[string]string{"content-type": "text/plain", "n": fmt.Sprint(i)},
		})
	}
	ctx := context.Background()
	noErrors(t, p.Publish(ctx, msgs), len(msgs))
	recs := e.readAll(t, e.topic, len(msgs))
	if len(recs) != len(msgs) {
		t.Fatalf("read %d records, want %d", len(recs), len(msgs))
	}
	partOf := map[string]int32{}
	last := map[string]int{}
	for _, r := range recs {
		id, key := header(r, idemkafka.DefaultIDHeader), string(r.Key)
		var n int
		fmt.Sscan(string(r.Value), &n)
		if id != msgs[n].ID || key != msgs[n].Key || header(r, "content-type") != "text/plain" || header(r, "n") != fmt.Sprint(n) {
			t.Fatalf("record %s/%d: id %q key %q headers %v", r.Topic, r.Offset, id, key, r.Headers)
		}
		if p, ok := partOf[key]; ok && p != r.Partition {
			t.Fatalf("key %s on partitions %d and %d", key, p, r.Partition)
		}
		partOf[key] = r.Partition
		if l, ok := last[key]; ok && n < l {
			t.Fatalf("key %s: event %d after %d", key, n, l)
		}
		last[key] = n
	}

	// Again: Kafka stores the repeat, the consumer applies each event once.
	noErrors(t, p.Publish(ctx, msgs), len(msgs))
	c := e.consumer(t, idemkafka.Config{BatchProcess: e.process(nil)})
	run(t, c)
	eventually(t, 30*time.Second, "every event applied", func() bool { return len(e.effects(t)) == len(msgs) })
	for id, n := range e.effects(t) {
		if n != 1 {
			t.Fatalf("%s applied %d times", id, n)
		}
	}
}

// TestOutboxPermanentErrors: what Kafka can never accept is permanent,
// per message, and the rest of the batch is produced.
func TestOutboxPermanentErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	small := "small-" + suffix()
	createTopicConfig(t, e, small, "max.message.bytes", "1024")
	cl := e.client(t, kgo.UnknownTopicRetries(1), kgo.ProducerBatchMaxBytes(64<<10))
	p := outboxPublisher(t, cl, nil)
	msgs := []outbox.Message{
		{ID: "ok-1", Topic: e.topic, Payload: []byte("fine")},
		{ID: "no-topic", Topic: "missing-" + suffix(), Payload: []byte("x")},
		{ID: "too-big-for-client", Topic: e.topic, Payload: make([]byte, 128<<10)},
		{ID: "too-big-for-topic", Topic: small, Payload: noise(4096)}, // incompressible
		{ID: "", Topic: e.topic, Payload: []byte("x")},
		{ID: "bad\x00id", Topic: e.topic, Payload: []byte("x")},
		{ID: "empty-topic", Payload: []byte("x")},
		{ID: "ok-2", Topic: small, Payload: []byte("fine")},
	}
	errs := p.Publish(context.Background(), msgs)
	if len(errs) != len(msgs) {
		t.Fatalf("%d errors for %d messages", len(errs), len(msgs))
	}
	for i, m := range msgs {
		err := errs[i]
		if strings.HasPrefix(m.ID, "ok-") {
			if err != nil {
				t.Errorf("%s: %v", m.ID, err)
			}
			continue
		}
		if !outbox.Permanent(err) || !strings.HasPrefix(fmt.Sprint(err), "idemkafka: ") {
			t.Errorf("%q: %v, want a permanent idemkafka error", m.ID, err)
		}
	}
	if !errors.Is(errs[1], kerr.UnknownTopicOrPartition) {
		t.Errorf("no topic: %v", errs[1])
	}
	for _, i := range []int{2, 3} {
		if !errors.Is(errs[i], kerr.MessageTooLarge) {
			t.Errorf("%s: %v", msgs[i].ID, errs[i])
		}
	}
	if !errors.Is(errs[5], idem.ErrInvalidKey) {
		t.Errorf("bad id: %v", errs[5])
	}
}

// noise returns n random bytes.
func noise(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func createTopicConfig(t *testing.T, e *env, name, key, value string) {
	t.Helper()
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = name, 1, 1
	c := kmsg.NewCreateTopicsRequestTopicConfig()
	c.Name, c.Value = key, &value
	rt.Configs = append(rt.Configs, c)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(context.Background(), e.admin)
	if err != nil || resp.Topics[0].ErrorCode != 0 {
		t.Fatalf("create topic: %v %+v", err, resp)
	}
}

// TestOutboxServerDown: with the cluster gone every message gets a
// retryable error within AckTimeout.
func TestOutboxServerDown(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.SeedTopics(1, "down"))
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	p := outboxPublisher(t, cl, &idemkafka.OutboxConfig{AckTimeout: 2 * time.Second})
	noErrors(t, p.Publish(context.Background(), []outbox.Message{{ID: "first", Topic: "down"}}), 1)
	c.Close()
	msgs := make([]outbox.Message, 10)
	for i := range msgs {
		msgs[i] = outbox.Message{ID: fmt.Sprintf("down-%d", i), Topic: "down", Key: "k", Payload: []byte("x")}
	}
	start := time.Now()
	for i, err := range p.Publish(context.Background(), msgs) {
		if err == nil || outbox.Permanent(err) || !idem.IsRetryable(err) {
			t.Fatalf("message %d: %v, want an idem.Retryable error", i, err)
		}
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("Publish took %v with AckTimeout 2s", d)
	}
}

// TestOutboxConcurrentPublishers: 32 relay workers share one publisher;
// every record is acknowledged, and the log holds each batch as often as
// it was published.
func TestOutboxConcurrentPublishers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4)
	p := outboxPublisher(t, e.client(t), nil)
	const workers, size = 32, 20
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			msgs := make([]outbox.Message, size)
			for i := range msgs {
				msgs[i] = outbox.Message{ID: fmt.Sprintf("w%d-%d", w, i), Topic: e.topic, Key: fmt.Sprintf("k%d", w%5), Payload: []byte("x")}
			}
			for i, err := range p.Publish(context.Background(), msgs) {
				if err != nil {
					t.Errorf("worker %d message %d: %v", w, i, err)
				}
			}
		})
	}
	wg.Wait()
	if got := e.readAll(t, e.topic, workers*size); len(got) != workers*size {
		t.Fatalf("log has %d records, want %d", len(got), workers*size)
	}
}

func TestNewOutboxPublisherConfig(t *testing.T) {
	t.Parallel()
	if _, err := idemkafka.NewOutboxPublisher(nil, nil); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("nil client: %v", err)
	}
	e := newEnv(t, 1)
	if _, err := idemkafka.NewOutboxPublisher(e.client(t, kgo.DisableIdempotentWrite()), nil); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("idempotence off: %v", err)
	}
	if _, err := idemkafka.NewOutboxPublisher(e.client(t), &idemkafka.OutboxConfig{AckTimeout: -1}); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("negative AckTimeout: %v", err)
	}
	// A header named like the id header does not replace the id.
	p := outboxPublisher(t, e.client(t), nil)
	noErrors(t, p.Publish(context.Background(), []outbox.Message{{ID: "real", Topic: e.topic,
		Headers: map[string]string{idemkafka.DefaultIDHeader: "fake"}}}), 1)
	r := e.readAll(t, e.topic, 1)
	if len(r) != 1 || header(r[0], idemkafka.DefaultIDHeader) != "real" || len(r[0].Headers) != 1 {
		t.Fatalf("records %v", r)
	}
}
