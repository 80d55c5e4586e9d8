package consume_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/retry"
)

// inProcess is a delivery its broker cannot redeliver alone (as a Kafka
// record): Retry only records the state the next attempt sees.
type inProcess struct{ *fakeDelivery }

func (inProcess) InProcess() {}

func (d inProcess) State() consume.State {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.next
}

func fastInProcess(c *consume.Config) {
	c.Retry = &retry.Policy{Base: time.Millisecond, Cap: 2 * time.Millisecond, MaxAttempts: 3, Jitter: retry.NoJitter}
}

// A failed batch is settled one delivery after the other, in order: a
// failing one is retried in process until it is dead-lettered before the
// next one runs; every attempt is one delivery for the hooks.
func TestInProcessRetriesInOrder(t *testing.T) {
	t.Parallel()
	l := newLedger()
	var (
		mu    sync.Mutex
		order []string
	)
	handler := func(_ context.Context, d consume.Delivery) error {
		mu.Lock()
		order = append(order, d.ID())
		mu.Unlock()
		if d.ID() == "b" {
			return errors.New("poison")
		}
		return nil
	}
	e, counters := newEngine(t, l.process(handler), fastInProcess)
	var ds []consume.Delivery
	for _, id := range []string{"a", "b", "c"} {
		ds = append(ds, inProcess{&fakeDelivery{id: id, body: []byte(id)}})
	}
	outs, err := e.HandleBatch(context.Background(), ds, l.batch(handler))
	if err != nil {
		t.Fatal(err)
	}
	if want := []idem.Outcome{idem.Processed, idem.DeadLettered, idem.Processed}; !slices.Equal(outs, want) {
		t.Fatalf("outcomes %v, want %v", outs, want)
	}
	// The batch ran a and stopped at b; then a, b three times, c.
	if got := strings.Join(order, ","); got != "a,b,a,b,b,b,c" {
		t.Fatalf("handler order %s", got)
	}
	b := ds[1].(inProcess)
	if b.ops() != "retry,retry,dead-letter" || b.dl.Attempts != 3 || b.dl.Reason != idem.DeadMaxAttempts {
		t.Fatalf("b settled %s, dead letter %+v", b.ops(), b.dl)
	}
	if s := counters.Snapshot(); s.Processed != 2 || s.Retried != 2 || s.DeadLettered != 1 {
		t.Fatalf("counters %+v", s)
	}
}

// A dead letter the broker did not take is tried again after a backoff;
// the engine returns once it is settled.
func TestInProcessSettleFailureRetried(t *testing.T) {
	t.Parallel()
	l := newLedger()
	e, counters := newEngine(t, l.process(func(context.Context, consume.Delivery) error {
		return retry.Permanent(errors.New("bad json"))
	}), fastInProcess)
	failed := false
	d := inProcess{&fakeDelivery{id: "x", body: []byte("x"), settleFn: func(op string) error {
		if op == "dead-letter" && !failed {
			failed = true
			return errors.New("broker down")
		}
		return nil
	}}}
	out, err := e.Handle(context.Background(), d)
	if out != idem.DeadLettered || err != nil || d.ops() != "dead-letter,dead-letter" {
		t.Fatalf("Handle = %v, %v; settled %s", out, err, d.ops())
	}
	if s := counters.Snapshot(); s.DeadLettered != 2 {
		t.Fatalf("counters %+v", s)
	}
}

// The end of ctx while waiting for the next attempt abandons the delivery.
func TestInProcessAbandonsWhenCancelled(t *testing.T) {
	t.Parallel()
	l := newLedger()
	ctx, cancel := context.WithCancel(context.Background())
	e, _ := newEngine(t, l.process(func(context.Context, consume.Delivery) error {
		time.AfterFunc(20*time.Millisecond, cancel) // during the wait
		return errors.New("flaky")
	}), func(c *consume.Config) {
		c.Retry = &retry.Policy{Base: time.Hour, Cap: time.Hour, MaxAttempts: 5, Jitter: retry.NoJitter}
	})
	d := inProcess{&fakeDelivery{id: "x", body: []byte("x")}}
	if out, err := e.Handle(ctx, d); out != idem.Abandoned || err != nil || d.ops() != "retry" {
		t.Fatalf("Handle = %v, %v; settled %s", out, err, d.ops())
	}
}
