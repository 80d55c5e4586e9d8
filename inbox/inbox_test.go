package inbox

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/idem-go/idem"
)

// unusedBackend satisfies Backend for configuration tests that never reach
// a database; every behaviour test runs against real stores (inboxtest).
type unusedBackend struct{ Backend[struct{}] }

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

func TestPrepare(t *testing.T) {
	t.Parallel()
	m, err := Prepare(Message{Source: "s", ID: "1", Type: "t"})
	if err != nil || m.Payload == nil || m.Fingerprint != idem.FingerprintParts([]byte("t"), nil) {
		t.Fatalf("prepare = %+v, %v", m, err)
	}
	fp := idem.FingerprintBytes([]byte("own"))
	if m, _ := Prepare(Message{Source: "s", ID: "1", Type: "t", Fingerprint: fp}); m.Fingerprint != fp {
		t.Fatal("a given fingerprint was replaced")
	}
	if _, err := Prepare(Message{Source: "s", ID: "1", Type: "t", OrderingKey: "\xff"}); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("invalid ordering key = %v", err)
	}
	if _, err := Prepare(Message{Source: "s", ID: "", Type: "t"}); !errors.Is(err, idem.ErrInvalidKey) {
		t.Fatalf("empty id = %v", err)
	}
}

func TestCutError(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", MaxErrorBytes) // 2 bytes each
	got := CutError(long)
	if len(got) > MaxErrorBytes || !utf8.ValidString(got) || len(got) < MaxErrorBytes-1 {
		t.Fatalf("cut to %d bytes, valid %v", len(got), utf8.ValidString(got))
	}
	if CutError("short") != "short" {
		t.Fatal("short text changed")
	}
}

func TestReceiveMismatch(t *testing.T) {
	t.Parallel()
	err := ReceiveMismatch("s", "m", 7)
	if !errors.Is(err, idem.ErrFingerprintMismatch) || !strings.Contains(err.Error(), `"m"`) || !strings.Contains(err.Error(), "row 7") {
		t.Fatalf("%v", err)
	}
}

func TestStatsInOrder(t *testing.T) {
	t.Parallel()
	got := StatsInOrder(map[State]StateCount{StateDead: {Count: 2}})
	if len(got) != 4 || got[3].State != StateDead || got[3].Count != 2 || got[0].State != StatePending || got[0].Count != 0 {
		t.Fatalf("%+v", got)
	}
}
