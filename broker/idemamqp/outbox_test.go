package idemamqp_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemamqp"
	"github.com/idem-go/idem/idemtest/faultnet"
	"github.com/idem-go/idem/outbox"
	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
)

func outboxMsg(i int, queue string) outbox.Message {
	return outbox.Message{ID: fmt.Sprintf("ob-%03d", i), Topic: queue, Payload: fmt.Appendf(nil, `{"n":%d}`, i),
		Headers: map[string]string{"content-type": "application/json", "tenant": "t1"}, Attempt: 1, CreatedAt: time.Unix(1700000000, 0)}
}

// getAll reads every message now in queue (basic.get until empty).
func getAll(t *testing.T, conn *amqp.Connection, queue string) []amqp.Delivery {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	var out []amqp.Delivery
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return out
		}
		out = append(out, d)
	}
}

func newOutboxPublisher(t *testing.T, dial idemamqp.DialFunc) *idemamqp.OutboxPublisher {
	t.Helper()
	p, err := idemamqp.NewOutboxPublisher(dial, &idemamqp.OutboxConfig{ConfirmTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func TestOutboxPublisherConfirmsAndProperties(t *testing.T) {
	topo, conn := newTopology(t)
	p := newOutboxPublisher(t, idemamqp.DialURL(amqpURL(t)))
	msgs := make([]outbox.Message, 20)
	for i := range msgs {
		msgs[i] = outboxMsg(i, topo.Queue)
	}
	// One unroutable message in the middle: it alone is refused, for good.
	msgs[7].Topic = topo.Queue + ".nowhere"
	errs := p.Publish(t.Context(), msgs)
	if len(errs) != len(msgs) {
		t.Fatalf("%d results for %d messages", len(errs), len(msgs))
	}
	for i, err := range errs {
		if i == 7 {
			if !outbox.Permanent(err) || idem.IsRetryable(err) {
				t.Fatalf("unroutable message: %v (permanent %v)", err, outbox.Permanent(err))
			}
			continue
		}
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	got := getAll(t, conn, topo.Queue)
	if len(got) != 19 {
		t.Fatalf("queue holds %d messages, want 19", len(got))
	}
	d := got[0]
	if d.MessageId != "ob-000" || string(d.Body) != `{"n":0}` || d.DeliveryMode != amqp.Persistent || d.ContentType != "application/json" ||
		d.Headers["tenant"] != "t1" || !d.Timestamp.Equal(time.Unix(1700000000, 0)) {
		t.Fatalf("delivered %+v", d)
	}
}

func TestOutboxPublisherConnectionLossIsRetried(t *testing.T) {
	topo, conn := newTopology(t)
	u, err := url.Parse(amqpURL(t))
	if err != nil {
		t.Fatal(err)
	}
	relay, err := faultnet.Start(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	u.Host = relay.Addr()
	p := newOutboxPublisher(t, idemamqp.DialURL(u.String()))
	if errs := p.Publish(t.Context(), []outbox.Message{outboxMsg(1, topo.Queue)}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	// A write cuts the connection both ways (the fault applies from the
	// relay's next read, so the publish already in its buffer may pass).
	relay.Set(faultnet.Fault{CutAfterRequest: 1, CutTarget: true})
	cut := false
	for try := 0; try < 5 && !cut; try++ {
		for i, err := range p.Publish(t.Context(), []outbox.Message{outboxMsg(2, topo.Queue), outboxMsg(3, topo.Queue)}) {
			if err != nil {
				cut = true
				if !idem.IsRetryable(err) || outbox.Permanent(err) {
					t.Fatalf("message %d over a cut connection: %v", i, err)
				}
			}
		}
	}
	if !cut {
		t.Fatal("five publishes over a cut connection succeeded")
	}
	// Refused while down, then the publisher dials again by itself.
	relay.Set(faultnet.Fault{Refuse: true})
	if errs := p.Publish(t.Context(), []outbox.Message{outboxMsg(2, topo.Queue)}); !idem.IsRetryable(errs[0]) {
		t.Fatalf("publish while the broker is unreachable: %v", errs[0])
	}
	relay.Set(faultnet.Fault{})
	if errs := p.Publish(t.Context(), []outbox.Message{outboxMsg(2, topo.Queue), outboxMsg(3, topo.Queue)}); errs[0] != nil || errs[1] != nil {
		t.Fatalf("publish after the broker came back: %v", errs)
	}
	ids := map[string]bool{}
	for _, d := range getAll(t, conn, topo.Queue) {
		ids[d.MessageId] = true
	}
	for _, id := range []string{"ob-001", "ob-002", "ob-003"} {
		if !ids[id] {
			t.Fatalf("%s missing from the queue (%v)", id, ids)
		}
	}
}

func TestOutboxPublisherInvalid(t *testing.T) {
	if _, err := idemamqp.NewOutboxPublisher(nil, nil); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("nil dial: %v", err)
	}
	if _, err := idemamqp.NewOutboxPublisher(idemamqp.DialURL("amqp://x"), &idemamqp.OutboxConfig{ConfirmTimeout: -1}); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("negative timeout: %v", err)
	}
	p, err := idemamqp.NewOutboxPublisher(func(context.Context) (*amqp.Connection, error) { return nil, errors.New("no route to host") }, nil)
	if err != nil {
		t.Fatal(err)
	}
	if errs := p.Publish(t.Context(), []outbox.Message{{ID: "a", Topic: "q"}}); !idem.IsRetryable(errs[0]) {
		t.Fatalf("dial failure: %v", errs[0])
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if errs := p.Publish(t.Context(), []outbox.Message{{ID: "a", Topic: "q"}}); errs[0] == nil {
		t.Fatal("Publish after Close succeeded")
	}
}

// TestOutboxRelayToRabbitMQ: events committed in PostgreSQL reach the
// queue through the relay; the event of a rolled-back transaction never
// does; an unroutable one is dead with its reason.
func TestOutboxRelayToRabbitMQ(t *testing.T) {
	topo, conn := newTopology(t)
	pg := newPG(t)
	ob := pg.store.Outbox()
	ctx := t.Context()
	write := func(evs ...outbox.Event) error {
		return pgx.BeginFunc(ctx, pg.pool, func(tx pgx.Tx) error { return ob.Write(ctx, tx, evs...) })
	}
	var evs []outbox.Event
	for i := range 50 {
		evs = append(evs, outbox.Event{Topic: topo.Queue, ID: fmt.Sprintf("order-%02d", i), Payload: []byte("{}")})
	}
	if err := write(evs...); err != nil {
		t.Fatal(err)
	}
	if err := write(outbox.Event{Topic: "nowhere." + topo.Queue, ID: "lost-cause"}); err != nil {
		t.Fatal(err)
	}
	abort := errors.New("abort")
	if err := pgx.BeginFunc(ctx, pg.pool, func(tx pgx.Tx) error {
		if err := ob.Write(ctx, tx, outbox.Event{Topic: topo.Queue, ID: "rolled-back"}); err != nil {
			return err
		}
		return abort
	}); !errors.Is(err, abort) {
		t.Fatal(err)
	}
	relay, err := outbox.NewRelay(ob, newOutboxPublisher(t, idemamqp.DialURL(amqpURL(t))),
		&outbox.Config{Workers: 3, BatchSize: 8, PollInterval: 10 * time.Millisecond, PurgeInterval: -1, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := relay.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "the outbox to drain", func() bool {
		st, err := ob.Stats(ctx)
		return err == nil && st[0].Count+st[1].Count == 0
	})
	if err := relay.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	ids := map[string]int{}
	for _, d := range getAll(t, conn, topo.Queue) {
		ids[d.MessageId]++
	}
	if len(ids) != 50 || ids["rolled-back"] != 0 {
		t.Fatalf("queue got %d ids: %v", len(ids), ids)
	}
	dead, err := ob.GetByEventID(ctx, "lost-cause")
	if err != nil || dead.State != outbox.StateDead || dead.DeadReason != idem.DeadPermanent || dead.Attempts != 1 {
		t.Fatalf("unroutable event = %+v, %v", dead, err)
	}
}
