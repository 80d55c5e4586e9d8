package idemamqp_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemamqp"
	"github.com/idem-go/idem/consume"
	amqp "github.com/rabbitmq/amqp091-go"
)

// TestInfrastructureErrorsDoNotDeadLetter: a store outage lasting far more
// runs than MaxAttempts retries through the retry queue and never reaches
// the dead letters.
func TestInfrastructureErrorsDoNotDeadLetter(t *testing.T) {
	t.Parallel()
	topo, conn := newTopology(t)
	var runs atomic.Int32
	p := func(ctx context.Context, msg idem.Message, d consume.Delivery) (idem.Outcome, error) {
		if runs.Add(1) <= 6 {
			return "", idem.Retryable(errors.New("connection refused"))
		}
		return idem.Processed, nil
	}
	c, counters := newConsumer(t, idemamqp.DialURL(amqpURL(t)), topo, p, nil)
	runConsumer(t, c)
	publish(t, conn, topo.Queue, "m", []byte("x"), 1)
	waitFor(t, 15*time.Second, "processing after the outage", func() bool { return counters.Snapshot().Processed == 1 })
	if s := counters.Snapshot(); s.DeadLettered != 0 || s.InfraRetried != 6 {
		t.Fatalf("counts %+v", s)
	}
}

// TestCommitUnknownRequeues: a commit of unknown outcome is neither acked
// nor counted; the broker redelivers it.
func TestCommitUnknownRequeues(t *testing.T) {
	t.Parallel()
	topo, conn := newTopology(t)
	var runs atomic.Int32
	p := func(ctx context.Context, msg idem.Message, d consume.Delivery) (idem.Outcome, error) {
		if runs.Add(1) == 1 {
			return "", fmt.Errorf("commit: %w", idem.ErrCommitUnknown)
		}
		return idem.Duplicate, nil // the first commit had in fact succeeded
	}
	c, counters := newConsumer(t, idemamqp.DialURL(amqpURL(t)), topo, p, nil)
	runConsumer(t, c)
	publish(t, conn, topo.Queue, "m", []byte("x"), 1)
	waitFor(t, 10*time.Second, "the redelivery", func() bool { return counters.Snapshot().Duplicate == 1 })
	if s := counters.Snapshot(); s.Requeued != 1 || s.Retried+s.DeadLettered != 0 {
		t.Fatalf("counts %+v", s)
	}
}

func TestRedriveCapAndFilter(t *testing.T) {
	t.Parallel()
	topo, conn := newTopology(t)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	pub := func(id string, redrives string) {
		h := amqp.Table{consume.HeaderReason: string(idem.DeadMaxAttempts), consume.HeaderOrigin: "/" + topo.Queue, consume.HeaderAttempts: "5"}
		if redrives != "" {
			h[idemamqp.HeaderRedrives] = redrives
		}
		if err := idemamqp.Publish(ctx, ch, topo.DeadLetterExchange, topo.DeadLetterQueue, amqp.Publishing{MessageId: id, Headers: h, Body: []byte(id)}); err != nil {
			t.Fatal(err)
		}
	}
	pub("a", "")
	pub("b", "3")
	pub("c", "1")
	res, err := idemamqp.Redrive(ctx, conn, topo.DeadLetterQueue, func(m idemamqp.DeadMessage) bool { return m.ID != "c" }, nil)
	if err != nil || fmt.Sprint(res.Redriven) != "[a]" || fmt.Sprint(res.Capped) != "[b]" {
		t.Fatalf("%+v %v", res, err)
	}
	waitFor(t, 5*time.Second, "the work queue", func() bool { return queueDepth(t, conn, topo.Queue) == 1 })
	if n := queueDepth(t, conn, topo.DeadLetterQueue); n != 2 {
		t.Fatalf("DLQ depth %d, want b (capped) and c (not chosen)", n)
	}
	d, ok, err := ch.Get(topo.Queue, true)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if d.Headers[idemamqp.HeaderRedrives] != "1" || d.Headers[consume.HeaderAttempts] != nil || d.Headers[consume.HeaderReason] != nil {
		t.Fatalf("redriven headers %v", d.Headers)
	}
	// A generous cap lets b through too.
	res, err = idemamqp.Redrive(ctx, conn, topo.DeadLetterQueue, nil, &idemamqp.RedriveOptions{MaxRedrives: 10})
	if err != nil || len(res.Redriven) != 2 {
		t.Fatalf("%+v %v", res, err)
	}
}

func TestBrokerErrors(t *testing.T) {
	t.Parallel()
	topo, conn := newTopology(t)
	ctx := context.Background()
	if _, err := idemamqp.ListDeadLetters(ctx, conn, "idemtest.missing."+suffix(), 1); err == nil {
		t.Fatal("listing a missing queue must fail")
	}
	if _, err := idemamqp.Redrive(ctx, conn, "idemtest.missing."+suffix(), nil, nil); err == nil {
		t.Fatal("redriving a missing queue must fail")
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := idemamqp.Publish(ctx, ch, "", topo.Queue, amqp.Publishing{Body: []byte("x")}); err == nil {
		t.Fatal("Publish on a channel without confirms must fail")
	}
	// A consumer whose topology conflicts with the declared queue stops
	// with the broker's error instead of reconnecting forever.
	ch2, _ := conn.Channel()
	defer ch2.Close()
	bad := idemamqp.Topology{Queue: topo.Queue, DeadLetterExchange: "other.dlx." + suffix()}
	defer ch2.ExchangeDelete(bad.DeadLetterExchange, false, false)
	c, _ := newConsumer(t, idemamqp.DialURL(amqpURL(t)), bad, func(context.Context, idem.Message, consume.Delivery) (idem.Outcome, error) {
		return idem.Processed, nil
	}, func(cfg *idemamqp.Config) { cfg.Declare = true })
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var aerr *amqp.Error
	if err := c.Run(rctx); !errors.As(err, &aerr) || aerr.Code != amqp.PreconditionFailed {
		t.Fatalf("Run = %v, want PRECONDITION_FAILED", err)
	}
	// Unreachable broker: Run keeps retrying until its context ends.
	c2, _ := newConsumer(t, idemamqp.DialURL("amqp://guest:guest@127.0.0.1:1/"), topo, func(context.Context, idem.Message, consume.Delivery) (idem.Outcome, error) {
		return idem.Processed, nil
	}, nil)
	sctx, scancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer scancel()
	if err := c2.Run(sctx); err != nil {
		t.Fatalf("Run after its context ended = %v", err)
	}
}

// NewConsumer does no I/O; Ping dials and checks the topology (unless the
// consumer declares it), with an error naming the step or queue.
func TestPing(t *testing.T) {
	t.Parallel()
	topo, _ := newTopology(t)
	p := func(context.Context, idem.Message, consume.Delivery) (idem.Outcome, error) {
		return idem.Processed, nil
	}
	c, _ := newConsumer(t, idemamqp.DialURL(amqpURL(t)), topo, p, nil)
	if err := c.Ping(t.Context()); err != nil {
		t.Fatal(err)
	}
	missing := idemamqp.Topology{Queue: "idemtest.absent." + suffix()}
	c, _ = newConsumer(t, idemamqp.DialURL(amqpURL(t)), missing, p, nil)
	if err := c.Ping(t.Context()); err == nil || !strings.Contains(err.Error(), `queue "`+missing.Queue+`"`) {
		t.Fatalf("Ping of an undeclared queue: %v", err)
	}
	c, _ = newConsumer(t, idemamqp.DialURL(amqpURL(t)), missing, p, func(cfg *idemamqp.Config) { cfg.Declare = true })
	if err := c.Ping(t.Context()); err != nil {
		t.Fatalf("Ping of a consumer that declares its topology: %v", err)
	}
	c, _ = newConsumer(t, idemamqp.DialURL("amqp://guest:guest@127.0.0.1:1/"), topo, p, nil)
	if err := c.Ping(t.Context()); err == nil || !strings.Contains(err.Error(), "idemamqp: dial") || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("Ping of a dead address: %v", err)
	}
}
