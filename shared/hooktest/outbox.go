package hooktest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/outbox/outboxdriver"
	"github.com/idem-go/idem/outbox/outboxtest"
	"github.com/idem-go/idem/retry"
)

// relayDriver is the in-memory outbox with faults in MarkSent: lose makes
// it mark nothing (another relay took the batch over), markErr makes the
// statement fail.
type relayDriver struct {
	*outboxtest.Memory
	mu      sync.Mutex
	lose    bool
	markErr error
}

func (d *relayDriver) set(lose bool, markErr error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.lose, d.markErr = lose, markErr
}

func (d *relayDriver) MarkSent(ctx context.Context, ls []outboxdriver.Lease) ([]int64, error) {
	d.mu.Lock()
	lose, markErr := d.lose, d.markErr
	d.mu.Unlock()
	if markErr != nil {
		return nil, markErr
	}
	if lose {
		return nil, nil
	}
	return d.Memory.MarkSent(ctx, ls)
}

// DriveOutbox runs a real outbox.Relay with hooks over the in-memory
// outbox, one RunOnce per batch, so that every outcome the relay reports
// occurs, in four batches: processed (2, topic "orders"), retried (1) and
// dead_lettered (permanent, 1); lease_lost (1); not_recorded (1); released
// (1, a hard stop during the publish). Ids and keys contain "secret"; the
// topic of the events not processed is "secret-topic". ctx is the relay's
// context (RunOnce's).
func DriveOutbox(t testing.TB, ctx context.Context, hooks []idem.Hook) {
	t.Helper()
	d := &relayDriver{Memory: outboxtest.NewMemory()}
	var cancelRun context.CancelFunc
	pub := outbox.PublisherFunc(func(ctx context.Context, msgs []outbox.Message) []error {
		errs := make([]error, len(msgs))
		for i, m := range msgs {
			switch {
			case strings.HasPrefix(m.ID, "retry"):
				errs[i] = errors.New("broker unavailable")
			case strings.HasPrefix(m.ID, "perm"):
				errs[i] = outbox.PermanentError(errors.New("message too large"))
			case strings.HasPrefix(m.ID, "rel"):
				cancelRun()
				errs[i] = context.Canceled
			}
		}
		return errs
	})
	r, err := outbox.NewRelay(d, pub, &outbox.Config{
		Workers: 1, PurgeInterval: -1, Logger: Quiet, Hooks: hooks,
		// Failed events are not due again during the test.
		Retry: &retry.Policy{Base: time.Hour, Cap: time.Hour, Jitter: retry.NoJitter, MaxAttempts: 10},
	})
	if err != nil {
		t.Fatal(err)
	}
	batch := func(runCtx context.Context, evs ...outbox.Event) {
		t.Helper()
		if err := d.InTx(t.Context(), func(ctx context.Context, tx *outboxtest.MemoryTx) error {
			return d.Write(ctx, tx, evs...)
		}); err != nil {
			t.Fatal(err)
		}
		n, err := r.RunOnce(runCtx)
		if err != nil || n != len(evs) {
			t.Fatalf("RunOnce = %d, %v; want %d", n, err, len(evs))
		}
	}
	ev := func(id, topic string) outbox.Event {
		return outbox.Event{ID: id, Topic: topic, Key: "secret-key-" + id, Payload: []byte("secret-payload")}
	}
	batch(ctx, ev("ok-secret-1", "orders"), ev("ok-secret-2", "orders"), ev("retry-secret-1", "secret-topic"), ev("perm-secret-1", "secret-topic"))
	d.set(true, nil)
	batch(ctx, ev("lost-secret-1", "secret-topic"))
	d.set(false, errors.New("connection reset"))
	batch(ctx, ev("nr-secret-1", "secret-topic"))
	d.set(false, nil)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	cancelRun = cancel
	batch(runCtx, ev("rel-secret-1", "secret-topic"))
}

// DriveConcurrentOutbox runs a real outbox.Relay with hooks and three
// loops over the in-memory outbox until it has published events events
// (ids "e-0", "e-1", ..., topic "t") in batches of 7, then stops it, so
// that the hooks are called from several goroutines at once.
func DriveConcurrentOutbox(t testing.TB, hooks []idem.Hook, events int) {
	t.Helper()
	ob := outboxtest.NewMemory()
	var mu sync.Mutex
	seen := map[string]bool{}
	done := make(chan struct{})
	pub := outbox.PublisherFunc(func(ctx context.Context, msgs []outbox.Message) []error {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range msgs {
			seen[m.ID] = true
		}
		if len(seen) == events {
			select {
			case <-done:
			default:
				close(done)
			}
		}
		return nil
	})
	relay, err := outbox.NewRelay(ob, pub, &outbox.Config{Workers: 3, BatchSize: 7, PollInterval: time.Millisecond,
		PurgeInterval: -1, Logger: Quiet, Hooks: hooks})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := relay.Start(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range events {
		if err := ob.InTx(ctx, func(ctx context.Context, tx *outboxtest.MemoryTx) error {
			return ob.Write(ctx, tx, outbox.Event{ID: fmt.Sprintf("e-%d", i), Topic: "t"})
		}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the relay did not publish every event")
	}
	if err := relay.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}
