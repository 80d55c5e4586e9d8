package inbox

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox/inboxdriver"
)

// unusedBackend satisfies Backend for configuration tests that never reach
// a database; every behaviour test runs against real stores (inboxtest).
type unusedBackend struct{ inboxdriver.Backend[struct{}] }

func TestNewWorkerConfig(t *testing.T) {
	t.Parallel()
	if _, err := NewWorker[struct{}](nil, nil); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("nil backend = %v", err)
	}
	w, err := NewWorker[struct{}](unusedBackend{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := w.Config()
	if c.Workers != DefaultWorkers || c.BatchSize != DefaultBatchSize || c.Lease != DefaultLease || c.Retention != idem.DefaultRetention || c.Logger == nil {
		t.Fatalf("defaults %+v", c)
	}
	for _, bad := range []Config{{Workers: -1}, {BatchSize: MaxBatch + 1}, {BatchSize: -1}, {Lease: time.Millisecond},
		{PollInterval: -1}, {Retention: -1}, {PurgeBatch: -1}} {
		if _, err := NewWorker[struct{}](unusedBackend{}, &bad); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("config %+v = %v", bad, err)
		}
	}
}

func TestHandleRegistration(t *testing.T) {
	t.Parallel()
	w, _ := NewWorker[struct{}](unusedBackend{}, &Config{PurgeInterval: -1, Workers: 1})
	h := func(context.Context, struct{}, Message) error { return nil }
	if err := w.Handle("a", h); err != nil {
		t.Fatal(err)
	}
	if err := w.Handle("a", h); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("duplicate handler = %v", err)
	}
	if err := w.Handle("b", nil); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("nil handler = %v", err)
	}
	if err := w.Stop(context.Background()); err != nil {
		t.Fatalf("stop before start = %v", err)
	}
}
