package idemnats_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemnats"
	"github.com/idem-go/idem/idemtest/faultnet"
	"github.com/idem-go/idem/outbox"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// outboxStream creates a uniquely named stream capturing prefix.> (deleted
// at cleanup) and returns its name and subject prefix.
func outboxStream(t *testing.T, js jetstream.JetStream, maxMsgSize int32) (stream, prefix string) {
	t.Helper()
	s := suffix()
	stream, prefix = "IDEMOUTBOX_"+s, "idemoutbox."+s
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{
		Name: stream, Subjects: []string{prefix + ".>"}, Duplicates: time.Minute,
		Storage: jetstream.MemoryStorage, MaxMsgSize: maxMsgSize,
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := js.DeleteStream(context.Background(), stream); err != nil {
			t.Log(err)
		}
	})
	return stream, prefix
}

func outboxPublisher(t *testing.T, js jetstream.JetStream, cfg *idemnats.OutboxConfig) *idemnats.OutboxPublisher {
	t.Helper()
	p, err := idemnats.NewOutboxPublisher(js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// readStream returns every message stored in stream, in order.
func readStream(t *testing.T, js jetstream.JetStream, stream string, want int) []jetstream.Msg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var out []jetstream.Msg
	for len(out) < want {
		b, err := c.Fetch(want-len(out), jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range b.Messages() {
			out = append(out, m)
		}
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d messages of %s", len(out), want, stream)
		}
	}
	return out
}

func streamCount(t *testing.T, js jetstream.JetStream, stream string) uint64 {
	t.Helper()
	s, err := js.Stream(context.Background(), stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
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

// TestOutboxPublish: a batch goes out in order with Nats-Msg-Id = ID and
// the headers; publishing it again (a relay that crashed before marking it
// sent) is confirmed without storing anything twice.
func TestOutboxPublish(t *testing.T) {
	_, js := connect(t)
	stream, prefix := outboxStream(t, js, 0)
	p := outboxPublisher(t, js, nil)
	var msgs []outbox.Message
	for i := range 50 {
		msgs = append(msgs, outbox.Message{
			ID: fmt.Sprintf("evt-%03d", i), Topic: prefix + ".orders", Key: "order-1",
			Payload: fmt.Appendf(nil, `{"n":%d}`, i), Headers: map[string]string{"Content-Type": "application/json", "Trace": fmt.Sprint(i)},
			Attempt: 1,
		})
	}
	ctx := context.Background()
	noErrors(t, p.Publish(ctx, msgs), len(msgs))
	got := readStream(t, js, stream, len(msgs))
	for i, m := range got {
		if id := m.Headers().Get(jetstream.MsgIDHeader); id != msgs[i].ID {
			t.Fatalf("message %d: Nats-Msg-Id %q, want %q", i, id, msgs[i].ID)
		}
		if string(m.Data()) != string(msgs[i].Payload) || m.Subject() != msgs[i].Topic {
			t.Fatalf("message %d: %s %q", i, m.Subject(), m.Data())
		}
		if m.Headers().Get("Content-Type") != "application/json" || m.Headers().Get("Trace") != fmt.Sprint(i) {
			t.Fatalf("message %d: headers %v", i, m.Headers())
		}
	}
	// The relay publishes the batch again: every message is confirmed (a
	// duplicate PubAck), none stored twice.
	for i := range msgs {
		msgs[i].Attempt = 2
	}
	noErrors(t, p.Publish(ctx, msgs), len(msgs))
	if n := streamCount(t, js, stream); n != uint64(len(msgs)) {
		t.Fatalf("stream has %d messages after the repeat, want %d", n, len(msgs))
	}
	if errs := p.Publish(ctx, nil); len(errs) != 0 {
		t.Fatalf("empty batch: %v", errs)
	}
}

// TestOutboxIDHeaderWins: a Nats-Msg-Id among the headers cannot replace
// the event's id.
func TestOutboxIDHeaderWins(t *testing.T) {
	_, js := connect(t)
	stream, prefix := outboxStream(t, js, 0)
	p := outboxPublisher(t, js, nil)
	noErrors(t, p.Publish(context.Background(), []outbox.Message{{ID: "real", Topic: prefix + ".x", Payload: []byte("x"),
		Headers: map[string]string{"nats-msg-id": "fake", jetstream.MsgIDHeader: "fake"}}}), 1)
	m := readStream(t, js, stream, 1)[0]
	if got := m.Headers().Values(jetstream.MsgIDHeader); len(got) != 1 || got[0] != "real" {
		t.Fatalf("Nats-Msg-Id %v, want [real]", got)
	}
}

// TestOutboxPermanentErrors: what the broker can never accept is
// permanent, per message, and the rest of the batch goes out.
func TestOutboxPermanentErrors(t *testing.T) {
	nc, js := connect(t)
	stream, prefix := outboxStream(t, js, 1024)
	p := outboxPublisher(t, js, nil)
	ok := func(id string) outbox.Message {
		return outbox.Message{ID: id, Topic: prefix + ".ok", Payload: []byte("fine")}
	}
	msgs := []outbox.Message{
		ok("ok-1"),
		{ID: "no-stream", Topic: "idemoutbox-nostream." + suffix(), Payload: []byte("x")},
		{ID: "too-big-for-stream", Topic: prefix + ".big", Payload: make([]byte, 4096)},
		{ID: "too-big-for-server", Topic: prefix + ".big", Payload: make([]byte, nc.MaxPayload()+1)},
		{ID: "", Topic: prefix + ".ok", Payload: []byte("x")},
		{ID: "bad\nid", Topic: prefix + ".ok", Payload: []byte("x")},
		{ID: "no-subject", Payload: []byte("x")},
		{ID: "wildcard", Topic: prefix + ".*", Payload: []byte("x")},
		{ID: "space", Topic: prefix + ".a b", Payload: []byte("x")},
		{ID: "empty-token", Topic: prefix + "..x", Payload: []byte("x")},
		{ID: "long-subject", Topic: prefix + "." + strings.Repeat("s", 2000), Payload: []byte("x")},
		{ID: "bad-header", Topic: prefix + ".ok", Payload: []byte("x"), Headers: map[string]string{"a: b": "c"}},
		{ID: "bad-header-value", Topic: prefix + ".ok", Payload: []byte("x"), Headers: map[string]string{"a": "b\r\nInjected: 1"}},
		ok("ok-2"),
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
		if !outbox.Permanent(err) {
			t.Errorf("%q: %v, want a permanent error", m.ID, err)
			continue
		}
		if !strings.HasPrefix(err.Error(), "idemnats: ") {
			t.Errorf("%q: error %q does not name the package", m.ID, err)
		}
	}
	if !strings.Contains(errs[1].Error(), "no stream captures subject") || !errors.Is(errs[1], jetstream.ErrNoStreamResponse) {
		t.Errorf("no stream: %v", errs[1])
	}
	if !errors.Is(errs[2], jetstream.ErrStreamMessageExceedsMaximum) {
		t.Errorf("too big for the stream: %v", errs[2])
	}
	if !errors.Is(errs[3], nats.ErrMaxPayload) {
		t.Errorf("too big for the server: %v", errs[3])
	}
	if !errors.Is(errs[5], idem.ErrInvalidKey) {
		t.Errorf("bad id: %v", errs[5])
	}
	if n := streamCount(t, js, stream); n != 2 {
		t.Fatalf("stream has %d messages, want the 2 good ones", n)
	}
}

// TestOutboxServerDown: with the server unreachable every message gets a
// retryable error within AckTimeout; once it is back the same messages go
// out.
func TestOutboxServerDown(t *testing.T) {
	_, direct := connect(t)
	stream, prefix := outboxStream(t, direct, 0)
	u, err := url.Parse(natsURL(t))
	if err != nil {
		t.Fatal(err)
	}
	relay, err := faultnet.Start(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { relay.Close() })
	nc, err := nats.Connect("nats://"+relay.Addr(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	p := outboxPublisher(t, js, &idemnats.OutboxConfig{AckTimeout: 2 * time.Second})
	var msgs []outbox.Message
	for i := range 10 {
		msgs = append(msgs, outbox.Message{ID: fmt.Sprintf("down-%d", i), Topic: prefix + ".x", Payload: []byte("x")})
	}
	noErrors(t, p.Publish(context.Background(), msgs[:1]), 1)

	// The server stops answering, then vanishes.
	relay.Set(faultnet.Fault{Hang: true})
	errs := p.Publish(context.Background(), msgs)
	relay.Set(faultnet.Fault{Refuse: true})
	relay.CloseConns()
	errs2 := p.Publish(context.Background(), msgs)
	for _, es := range [][]error{errs, errs2} {
		for i, err := range es {
			if err == nil && i > 0 {
				t.Fatalf("message %d confirmed while the server was away", i)
			}
			if err != nil && (outbox.Permanent(err) || !idem.IsRetryable(err)) {
				t.Fatalf("message %d: %v; an outage must be idem.Retryable, not permanent", i, err)
			}
		}
	}
	relay.Set(faultnet.Fault{})
	eventually(t, 30*time.Second, "the connection is back", nc.IsConnected)
	noErrors(t, p.Publish(context.Background(), msgs), len(msgs))
	if n := streamCount(t, direct, stream); n != uint64(len(msgs)) {
		t.Fatalf("stream has %d messages, want %d", n, len(msgs))
	}
}

// TestOutboxConcurrentPublishers: 32 relay workers share one publisher
// (and JetStream context); every message is confirmed once, stored once.
func TestOutboxConcurrentPublishers(t *testing.T) {
	_, js := connect(t)
	stream, prefix := outboxStream(t, js, 0)
	p := outboxPublisher(t, js, nil)
	const workers, batches, size = 32, 4, 25
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for b := range batches {
				msgs := make([]outbox.Message, size)
				for i := range msgs {
					msgs[i] = outbox.Message{ID: fmt.Sprintf("w%d-b%d-%d", w, b, i), Topic: fmt.Sprintf("%s.w%d", prefix, w), Payload: []byte("x")}
				}
				// Half the batches are published twice, as after a crash.
				for range 1 + b%2 {
					for i, err := range p.Publish(context.Background(), msgs) {
						if err != nil {
							t.Errorf("worker %d batch %d message %d: %v", w, b, i, err)
						}
					}
				}
			}
		})
	}
	wg.Wait()
	if n := streamCount(t, js, stream); n != workers*batches*size {
		t.Fatalf("stream has %d messages, want %d", n, workers*batches*size)
	}
}

// TestOutboxCanceled: a context that ended fails every unconfirmed message
// with a retryable error.
func TestOutboxCanceled(t *testing.T) {
	_, js := connect(t)
	_, prefix := outboxStream(t, js, 0)
	p := outboxPublisher(t, js, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	errs := p.Publish(ctx, []outbox.Message{{ID: "a", Topic: prefix + ".x"}, {ID: "b", Topic: prefix + ".x"}})
	for i, err := range errs {
		if !errors.Is(err, context.Canceled) || outbox.Permanent(err) || !idem.IsRetryable(err) {
			t.Fatalf("message %d: %v, want a retryable context.Canceled", i, err)
		}
	}
}

func TestNewOutboxPublisherConfig(t *testing.T) {
	if _, err := idemnats.NewOutboxPublisher(nil, nil); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("nil JetStream: %v", err)
	}
	_, js := connect(t)
	if _, err := idemnats.NewOutboxPublisher(js, &idemnats.OutboxConfig{AckTimeout: -time.Second}); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("negative AckTimeout: %v", err)
	}
}
