package consume_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/idemtest"
)

// retentionStore records the retention of every completion.
type retentionStore struct {
	*idemtest.MemoryStore
	mu  sync.Mutex
	got []time.Duration
}

func (s *retentionStore) Complete(ctx context.Context, req idem.CompleteRequest) error {
	s.mu.Lock()
	s.got = append(s.got, req.Retention)
	s.mu.Unlock()
	return s.MemoryStore.Complete(ctx, req)
}

// TestGuardProcessRetention: the retention applied to a Guard's record is
// the consumer's Config.Retention (the one its start-up check validated),
// not the Guard's own, shorter one.
func TestGuardProcessRetention(t *testing.T) {
	t.Parallel()
	store := &retentionStore{MemoryStore: idemtest.NewMemoryStore(nil)}
	g := idem.NewGuard(store, &idem.GuardConfig{Retention: time.Minute, Logger: quiet})
	p := consume.GuardProcess(g, func(context.Context, idem.Run, consume.Delivery) error { return nil })
	e, _ := newEngine(t, p, func(c *consume.Config) { c.Retention = 48 * time.Hour })
	if out, err := e.Handle(context.Background(), &fakeDelivery{id: "m1", body: []byte("a")}); out != idem.Processed || err != nil {
		t.Fatal(out, err)
	}
	// A Guard call without a retention keeps the Guard's.
	if _, err := g.Do(context.Background(), idem.Call{Scope: "s", Key: "k"}, func(context.Context, idem.Run) ([]byte, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	if len(store.got) != 2 || store.got[0] != 48*time.Hour || store.got[1] != time.Minute {
		t.Fatalf("retentions applied %v, want [48h 1m]", store.got)
	}
}
