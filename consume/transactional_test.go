package consume_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consume"
)

func TestTransactional(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := newLedger()
	boom := errors.New("insert failed")
	var ran []string
	p := consume.Transactional(l, func(ctx context.Context, tx *ledgerTx, d consume.Delivery) error {
		if tx == nil {
			t.Error("no transaction")
		}
		ran = append(ran, d.ID())
		if string(d.Body()) == "fail" {
			return boom
		}
		return nil
	})
	msg := func(key, body string) idem.Message {
		return idem.Message{Scope: "s", Key: key, Fingerprint: idem.FingerprintBytes([]byte(body))}
	}
	for _, c := range []struct {
		key, body string
		want      idem.Outcome
		wantErr   error
	}{
		{"a", "1", idem.Processed, nil},
		{"a", "1", idem.Duplicate, nil},
		{"a", "2", idem.Mismatch, idem.ErrFingerprintMismatch},
		{"b", "fail", "", boom},
		{"b", "fail", "", boom}, // rolled back: runs again
	} {
		got, err := p(ctx, msg(c.key, c.body), &fakeDelivery{id: c.key, body: []byte(c.body)})
		if got != c.want || !errors.Is(err, c.wantErr) || (c.wantErr == nil) != (err == nil) {
			t.Errorf("%s %s: %v, %v; want %v, %v", c.key, c.body, got, err, c.want, c.wantErr)
		}
	}
	if fmt.Sprint(ran) != "[a b b]" || l.effects["a"] != 1 || l.effects["b"] != 0 {
		t.Fatalf("ran %v, effects %v", ran, l.effects)
	}
}

func TestTransactionalBatchRunsOnceWithTheFresh(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := newLedger()
	var calls [][]string
	p := consume.TransactionalBatch(l, func(_ context.Context, _ *ledgerTx, fresh []consume.Delivery) error {
		var ids []string
		for _, d := range fresh {
			ids = append(ids, d.ID())
		}
		calls = append(calls, ids)
		return nil
	})
	batch := func(ids ...string) ([]idem.Outcome, error) {
		var msgs []idem.Message
		var ds []consume.Delivery
		for _, id := range ids {
			msgs = append(msgs, idem.Message{Scope: "s", Key: id})
			ds = append(ds, &fakeDelivery{id: id})
		}
		return p(ctx, msgs, ds)
	}
	if res, err := batch("a", "b"); err != nil || fmt.Sprint(res) != "[processed processed]" {
		t.Fatal(res, err)
	}
	if res, err := batch("c", "a", "d", "c"); err != nil || fmt.Sprint(res) != "[processed duplicate processed duplicate]" {
		t.Fatal(res, err)
	}
	if res, err := batch("a", "d"); err != nil || fmt.Sprint(res) != "[duplicate duplicate]" {
		t.Fatal(res, err)
	}
	if fmt.Sprint(calls) != "[[a b] [c d]]" {
		t.Fatalf("handler calls %v: want one per batch with new messages, with those only", calls)
	}

	boom := errors.New("batch insert failed")
	failing := consume.TransactionalBatch(l, func(context.Context, *ledgerTx, []consume.Delivery) error { return boom })
	if res, err := failing(ctx, []idem.Message{{Scope: "s", Key: "e"}}, []consume.Delivery{&fakeDelivery{id: "e"}}); !errors.Is(err, boom) || res != nil {
		t.Fatal(res, err)
	}
	if l.effects["e"] != 0 {
		t.Fatal("a failed batch recorded its message")
	}
}

func TestTransactionalNeedsProcessorAndHandler(t *testing.T) {
	t.Parallel()
	handle := func(context.Context, *ledgerTx, consume.Delivery) error { return nil }
	handleBatch := func(context.Context, *ledgerTx, []consume.Delivery) error { return nil }
	for name, f := range map[string]func(){
		"nil processor":       func() { consume.Transactional[*ledgerTx](nil, handle) },
		"nil handler":         func() { consume.Transactional[*ledgerTx](newLedger(), nil) },
		"batch nil processor": func() { consume.TransactionalBatch[*ledgerTx](nil, handleBatch) },
		"batch nil handler":   func() { consume.TransactionalBatch[*ledgerTx](newLedger(), nil) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
}
