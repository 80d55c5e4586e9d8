package consume_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consume"
)

// batch is the ledger's batch ProcessFunc: all-or-nothing over the fresh
// messages, failing when any handler fails.
func (l *ledger) batch(handler func(ctx context.Context, d consume.Delivery) error) consume.BatchProcessFunc {
	return consume.TransactionalBatch(l, func(ctx context.Context, _ *ledgerTx, fresh []consume.Delivery) error {
		for _, d := range fresh {
			if err := handler(ctx, d); err != nil {
				return err
			}
		}
		return nil
	})
}

func deliveries(specs ...[2]string) []consume.Delivery {
	var ds []consume.Delivery
	for _, s := range specs {
		ds = append(ds, &fakeDelivery{id: s[0], body: []byte(s[1])})
	}
	return ds
}

func TestHandleBatch(t *testing.T) {
	t.Parallel()
	l := newLedger()
	e, c := newEngine(t, l.process(ok), nil)
	ctx := context.Background()
	if out, _ := e.Handle(ctx, &fakeDelivery{id: "old", body: []byte("o")}); out != idem.Processed {
		t.Fatal(out)
	}
	ds := deliveries([2]string{"a", "1"}, [2]string{"old", "o"}, [2]string{"", "x"}, [2]string{"b", "2"}, [2]string{"a", "1"}, [2]string{"old", "changed"})
	outs, err := e.HandleBatch(ctx, ds, l.batch(ok))
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(outs); got != "[processed duplicate dead_lettered processed duplicate dead_lettered]" {
		t.Fatal(got)
	}
	if r := ds[2].(*fakeDelivery).dl.Reason; r != idem.DeadMissingID {
		t.Fatal(r)
	}
	if r := ds[5].(*fakeDelivery).dl.Reason; r != idem.DeadMismatch {
		t.Fatal(r)
	}
	for i, d := range ds {
		if ops := d.(*fakeDelivery).ops(); ops != "ack" && ops != "dead-letter" {
			t.Fatalf("delivery %d settled %q", i, ops)
		}
	}
	if s := c.Snapshot(); s.Processed != 3 || s.Duplicate != 2 || s.DeadLettered != 2 || l.effects["a"] != 1 {
		t.Fatalf("counts %+v effects %v", s, l.effects)
	}
}

func TestHandleBatchFallsBackOneByOne(t *testing.T) {
	t.Parallel()
	poison := func(_ context.Context, d consume.Delivery) error {
		if d.ID() == "bad" {
			return errors.New("cannot apply")
		}
		return nil
	}
	for name, process := range map[string]func(l *ledger) consume.BatchProcessFunc{
		"error": func(l *ledger) consume.BatchProcessFunc { return l.batch(poison) },
		"panic": func(*ledger) consume.BatchProcessFunc {
			return func(context.Context, []idem.Message, []consume.Delivery) ([]idem.Outcome, error) { panic("boom") }
		},
		"short results": func(*ledger) consume.BatchProcessFunc {
			return func(context.Context, []idem.Message, []consume.Delivery) ([]idem.Outcome, error) {
				return nil, nil
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			l := newLedger()
			e, _ := newEngine(t, l.process(poison), nil)
			ds := deliveries([2]string{"a", "1"}, [2]string{"bad", "2"}, [2]string{"c", "3"})
			outs, err := e.HandleBatch(context.Background(), ds, process(l))
			if err != nil || fmt.Sprint(outs) != "[processed retried processed]" {
				t.Fatal(outs, err)
			}
			if l.effects["a"] != 1 || l.effects["c"] != 1 || l.effects["bad"] != 0 {
				t.Fatal(l.effects)
			}
		})
	}
}

func TestHandleBatchCancelled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	l := newLedger()
	e, _ := newEngine(t, l.process(ok), nil)
	outs, err := e.HandleBatch(ctx, deliveries([2]string{"a", "1"}), func(ctx context.Context, _ []idem.Message, _ []consume.Delivery) ([]idem.Outcome, error) {
		cancel()
		return nil, ctx.Err()
	})
	if err != nil || outs[0] != idem.Abandoned {
		t.Fatal(outs, err)
	}
	if outs, _ := e.HandleBatch(context.Background(), deliveries([2]string{"", "x"}), l.batch(ok)); outs[0] != idem.DeadLettered {
		t.Fatal(outs)
	}
}
