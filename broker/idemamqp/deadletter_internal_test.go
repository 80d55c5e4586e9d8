package idemamqp

import (
	"context"
	"crypto/rand"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/retry"
	amqp "github.com/rabbitmq/amqp091-go"
)

// lostAck drops acks, as a crash right after the dead letter was
// published would.
type lostAck struct{}

func (lostAck) Ack(uint64, bool) error        { return nil }
func (lostAck) Nack(uint64, bool, bool) error { return nil }
func (lostAck) Reject(uint64, bool) error     { return nil }

// A message whose ack was lost after its dead letter was published is
// redelivered and dead-lettered again: both copies carry the same
// dead-letter id; ListDeadLetters returns one with Copies 2,
// ScanDeadLetters marks the second a repeat, and Redrive sends one back
// and drops the other.
func TestDeadLetterAgainAfterRedelivery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := idemtest.ServiceURL(t, "IDEM_AMQP_URL")
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	topo := Topology{Queue: "idemtest.dlrepeat." + rand.Text()}.WithDefaults()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := Declare(ch, topo); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Delete(ch, topo); ch.Close() })
	pub, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Confirm(false); err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"order":9}`)
	if err := Publish(ctx, pub, "", topo.Queue, amqp.Publishing{MessageId: "order-9", Body: body}); err != nil {
		t.Fatal(err)
	}
	c, err := NewConsumer(DialURL(url), &Config{Config: consume.Config{Name: "orders", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))},
		Topology: topo, Process: func(context.Context, idem.Message, consume.Delivery) (idem.Outcome, error) {
			return "", retry.Permanent(errors.New("bad json"))
		}})
	if err != nil {
		t.Fatal(err)
	}
	s := &session{c: c, pub: pub}
	handle := func(get *amqp.Channel, lose bool) {
		t.Helper()
		var d amqp.Delivery
		for deadline := time.Now().Add(5 * time.Second); ; {
			var ok bool
			if d, ok, err = get.Get(topo.Queue, false); err != nil {
				t.Fatal(err)
			} else if ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("no delivery")
			}
			time.Sleep(20 * time.Millisecond)
		}
		if lose {
			d.Acknowledger = lostAck{}
		}
		if out, err := c.engine.Handle(ctx, &delivery{s: s, d: d}); out != idem.DeadLettered || err != nil {
			t.Fatal(out, err)
		}
	}
	first, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	handle(first, true)
	first.Close() // the unacked original goes back to the queue
	again, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	handle(again, false)

	dead, err := ListDeadLetters(ctx, conn, topo.DeadLetterQueue, 10)
	if err != nil {
		t.Fatal(err)
	}
	want := DeadLetterID(topo.Queue, "order-9", body)
	if len(dead) != 1 || dead[0].Copies != 2 || dead[0].DeadLetterID != want || dead[0].OriginalID != "order-9" || dead[0].ID != "order-9" {
		t.Fatalf("dead letters %+v, want one with 2 copies and dead-letter id %s", dead, want)
	}
	var repeats []bool
	for m, err := range ScanDeadLetters(ctx, conn, topo.DeadLetterQueue, 10) {
		if err != nil {
			t.Fatal(err)
		}
		repeats = append(repeats, m.Repeat)
	}
	if len(repeats) != 2 || repeats[0] || !repeats[1] {
		t.Fatalf("scan repeats %v, want [false true]", repeats)
	}
	res, err := Redrive(ctx, conn, topo.DeadLetterQueue, nil, nil)
	if err != nil || len(res.Redriven) != 1 || len(res.Dropped) != 1 {
		t.Fatalf("redrive %+v %v", res, err)
	}
	q, err := again.QueueDeclarePassive(topo.DeadLetterQueue, true, false, false, false, nil)
	if err != nil || q.Messages != 0 {
		t.Fatalf("dead-letter queue after redrive: %+v %v", q, err)
	}
}
