package outbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/outbox/outboxtest"
)

// TestMemory runs the conformance suite over the in-memory outbox: the
// relay's own behaviour, without a database (the SQL stores run the same
// suite against their servers).
func TestMemory(t *testing.T) {
	t.Parallel()
	outboxtest.Run(t, func(t *testing.T) outboxtest.Env[*outboxtest.MemoryTx] {
		m := outboxtest.NewMemory()
		return outboxtest.Env[*outboxtest.MemoryTx]{Backend: m, InTx: m.InTx}
	})
}

func TestPermanent(t *testing.T) {
	t.Parallel()
	base := errors.New("no such queue")
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{base, false},
		{outbox.PermanentError(base), true},
		{errors.Join(errors.New("x"), outbox.PermanentError(base)), true},
		{errors.Join(errors.New("x"), base), false},
		{idem.Retryable(outbox.PermanentError(base)), true},
	} {
		if got := outbox.Permanent(tc.err); got != tc.want {
			t.Errorf("Permanent(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
	if outbox.PermanentError(nil) != nil {
		t.Error("PermanentError(nil) != nil")
	}
	if err := outbox.PermanentError(base); !errors.Is(err, base) || err.Error() != base.Error() {
		t.Errorf("PermanentError hides its cause: %v", err)
	}
}

// startEnd records the hooks' calls: the end hooks must get the context
// the start hooks returned.
type startEnd struct {
	starts, ends int
	sawCtx       bool
}

type ctxKey struct{}

func (h *startEnd) OnPublishStart(ctx context.Context, msgs []outbox.Message) context.Context {
	h.starts += len(msgs)
	return context.WithValue(ctx, ctxKey{}, true)
}

func (h *startEnd) OnPublishEnd(ctx context.Context, r outbox.Result) {
	h.ends++
	h.sawCtx = ctx.Value(ctxKey{}) == true
}

func TestHooksAndNotify(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	m := outboxtest.NewMemory()
	hooks := &startEnd{}
	published := make(chan string, 10)
	pub := outbox.PublisherFunc(func(ctx context.Context, msgs []outbox.Message) []error {
		if ctx.Value(ctxKey{}) != true {
			t.Error("Publish did not get the start hook's context")
		}
		for _, m := range msgs {
			published <- m.ID
		}
		return nil
	})
	// A poll interval far beyond the test: only Notify can wake the relay.
	r, err := outbox.NewRelay(m, pub, &outbox.Config{Workers: 1, PollInterval: time.Hour, PurgeInterval: -1, Hooks: []idem.Hook{hooks}})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// Most likely the loop's first claim found nothing and it is idle for
	// an hour; had it not claimed yet, it publishes right away anyway.
	time.Sleep(10 * time.Millisecond)
	tx := m.Begin()
	if err := outbox.Write(ctx, m, tx, outbox.Event{Topic: "t", ID: "a"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	r.Notify()
	select {
	case id := <-published:
		if id != "a" {
			t.Fatalf("published %q", id)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Notify did not wake the relay")
	}
	if err := r.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if hooks.starts != 1 || hooks.ends != 1 || !hooks.sawCtx {
		t.Fatalf("hooks %+v", hooks)
	}
}
