package inboxdriver

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/idem-go/idem"
)

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

func TestStatesIsACopy(t *testing.T) {
	t.Parallel()
	States()[0] = "changed"
	if !slices.Equal(States(), []State{StatePending, StateRunning, StateProcessed, StateDead}) {
		t.Fatalf("States() = %v", States())
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	for _, sel := range []Select{{}, {All: true, IDs: []int64{1}}, {IDs: make([]int64, MaxBatch+1)}} {
		if err := ValidateSelect(sel); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("select %v = %v", len(sel.IDs), err)
		}
	}
	if err := ValidateSelect(Select{IDs: []int64{1}}); err != nil {
		t.Error(err)
	}
	if n, err := ListLimit(ListRequest{}); n != 100 || err != nil {
		t.Errorf("default list limit = %d, %v", n, err)
	}
	if _, err := ListLimit(ListRequest{Limit: MaxBatch + 1}); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("list limit above MaxBatch = %v", err)
	}
}
