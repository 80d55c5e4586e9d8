package hooklabel

import (
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/idem-go/idem"
)

// wantLabels fails t for each input of want that label maps to another
// value.
func wantLabels[T comparable](t *testing.T, name string, label func(T) string, want map[T]string) {
	t.Helper()
	for in, w := range want {
		if got := label(in); got != w {
			t.Errorf("%s(%#v) = %q, want %q", name, in, got, w)
		}
	}
}

// TestConsumeOutcomes: the consumer outcomes are idem's message-path
// outcomes plus processed, duplicate and panicked, each its own label.
func TestConsumeOutcomes(t *testing.T) {
	t.Parallel()
	want := []idem.Outcome{idem.Processed, idem.Duplicate, idem.Panicked, idem.Retried, idem.DeadLettered, idem.Requeued, idem.Abandoned}
	got := ConsumeOutcomes()
	if !slices.Equal(got, want) {
		t.Fatalf("ConsumeOutcomes() = %v, want %v", got, want)
	}
	for _, o := range got {
		if Outcome(o) != string(o) {
			t.Errorf("%v is reported as %q", o, Outcome(o))
		}
	}
}

func TestConsumeOutcomesIsACopy(t *testing.T) {
	t.Parallel()
	ConsumeOutcomes()[0] = "changed"
	if ConsumeOutcomes()[0] != idem.Processed {
		t.Fatal("a caller changed the known outcomes")
	}
}

func TestDeadReason(t *testing.T) {
	t.Parallel()
	wantLabels(t, "DeadReason", DeadReason, map[idem.DeadReason]string{
		idem.DeadMaxAttempts: "max_attempts",
		idem.DeadPermanent:   "permanent",
		idem.DeadMismatch:    "mismatch",
		idem.DeadMissingID:   "missing_id",
		idem.DeadInvalidID:   "invalid_id",
		idem.DeadNoHandler:   "no_handler",
		"":                   Other,
		"something new":      Other,
		"Permanent":          Other,
		"id_conflict":        Other, // the consume reason before idem.DeadMismatch
		"\xff":               Other,
	})
}

// Every outcome idem declares is its own label, whichever component
// reports it (the HTTP, Guard, consumer and inbox ones alike).
func TestOutcome(t *testing.T) {
	t.Parallel()
	wantLabels(t, "Outcome", Outcome, map[idem.Outcome]string{
		idem.Acquired:     "acquired",
		idem.Completed:    "completed",
		idem.Processed:    "processed",
		idem.Duplicate:    "duplicate",
		idem.Mismatch:     "mismatch",
		idem.InProgress:   "in_progress",
		idem.Released:     "released",
		idem.LeaseLost:    "lease_lost",
		idem.Panicked:     "panicked",
		idem.Rejected:     "rejected",
		idem.Errored:      "error",
		idem.NotRecorded:  "not_recorded",
		idem.Retried:      "retried",
		idem.DeadLettered: "dead_lettered",
		idem.Requeued:     "requeued",
		idem.Abandoned:    "abandoned",
		idem.Discarded:    "discarded",
		idem.Tombstoned:   "tombstoned",
		idem.Canceled:     "canceled",
		idem.InDoubt:      "in_doubt",
		"":                Other,
		"brand_new":       Other,
		"Processed":       Other,
		"executed":        Other, // the labels before idem.Outcome
		"\xff":            Other,
	})
}

func TestStatusClass(t *testing.T) {
	t.Parallel()
	wantLabels(t, "StatusClass", StatusClass, map[int]string{
		-200: Other, 0: Other, 99: Other,
		100: "1xx", 199: "1xx", 200: "2xx", 201: "2xx", 304: "3xx",
		400: "4xx", 422: "4xx", 499: "4xx", 500: "5xx", 599: "5xx",
		600: Other, 1000: Other,
	})
}

func TestSetCapsValues(t *testing.T) {
	t.Parallel()
	s := NewSet(2)
	type result struct {
		label string
		first bool
	}
	for i, c := range []struct {
		v    string
		want result
	}{
		{"a", result{"a", true}},
		{"a", result{"a", false}},
		{"b", result{"b", true}},
		{"c", result{Other, false}}, // beyond the cap
		{"c", result{Other, false}},
		{"b", result{"b", false}}, // admitted values stay admitted
		{"a", result{"a", false}},
		{"", result{Other, false}},
		{"\xff", result{Other, false}},
		{"caf\xc3", result{Other, false}}, // a cut multi-byte rune
	} {
		label, first := s.Label(c.v)
		if got := (result{label, first}); got != c.want {
			t.Errorf("call %d: Label(%q) = %+v, want %+v", i, c.v, got, c.want)
		}
	}
}

func TestSetRejectsEmptyAndInvalidBeforeTheCap(t *testing.T) {
	t.Parallel()
	s := NewSet(1)
	for _, v := range []string{"", "\xff", "a\x80b", "\xed\xa0\x80"} { // the last is a UTF-16 surrogate
		if label, first := s.Label(v); label != Other || first {
			t.Errorf("Label(%q) = %q, %v", v, label, first)
		}
	}
	// None of them took the only place.
	if label, first := s.Label("é"); label != "é" || !first {
		t.Fatalf("Label(é) = %q, %v after invalid values", label, first)
	}
}

func TestSetWithoutRoom(t *testing.T) {
	t.Parallel()
	for _, limit := range []int{0, -1} {
		if label, first := NewSet(limit).Label("a"); label != Other || first {
			t.Errorf("NewSet(%d).Label(a) = %q, %v", limit, label, first)
		}
	}
}

// TestSetConcurrent has many goroutines race for more values than the cap:
// each value is admitted at most once, exactly limit values are admitted,
// and every call agrees on whether a value was admitted. Run with -race.
func TestSetConcurrent(t *testing.T) {
	t.Parallel()
	const goroutines, values, limit = 64, 40, 16
	s := NewSet(limit)
	var (
		mu       sync.Mutex
		firsts   = map[string]int{}
		labelsOf = map[string]map[string]bool{}
		wg       sync.WaitGroup
	)
	for g := range goroutines {
		wg.Go(func() {
			local := map[string][]string{}
			var admitted []string
			for i := range values {
				v := fmt.Sprintf("v%d", (i+g)%values) // each goroutine in another order
				label, first := s.Label(v)
				local[v] = append(local[v], label)
				if first {
					admitted = append(admitted, v)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			for _, v := range admitted {
				firsts[v]++
			}
			for v, labels := range local {
				if labelsOf[v] == nil {
					labelsOf[v] = map[string]bool{}
				}
				for _, l := range labels {
					labelsOf[v][l] = true
				}
			}
		})
	}
	wg.Wait()
	if len(firsts) != limit {
		t.Fatalf("%d values admitted, want %d", len(firsts), limit)
	}
	for v, n := range firsts {
		if n != 1 {
			t.Errorf("%s admitted %d times", v, n)
		}
	}
	for v, labels := range labelsOf {
		want := Other
		if _, admitted := firsts[v]; admitted {
			want = v
		}
		if len(labels) != 1 || !labels[want] {
			t.Errorf("%s labelled %v, want only %q", v, labels, want)
		}
	}
}
