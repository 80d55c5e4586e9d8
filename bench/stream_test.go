package bench_test

import (
	"testing"

	"github.com/idem-go/idem/bench"
)

func TestStream(t *testing.T) {
	t.Parallel()
	for _, dup := range []int{0, 30} {
		s := bench.NewStream("p", 10000, dup, 7)
		seen := map[string]bool{}
		for _, k := range s.Keys {
			seen[k] = true
		}
		if len(seen) != s.Distinct {
			t.Fatalf("dup %d: %d distinct keys, Distinct says %d", dup, len(seen), s.Distinct)
		}
		got := 100 * (len(s.Keys) - s.Distinct) / len(s.Keys)
		if got < dup-2 || got > dup+2 {
			t.Errorf("dup %d: %d%% duplicates", dup, got)
		}
		again := bench.NewStream("p", 10000, dup, 7)
		if again.Keys[9999] != s.Keys[9999] {
			t.Error("stream is not deterministic")
		}
	}
}

func TestResultStats(t *testing.T) {
	t.Parallel()
	r := bench.Result{Rates: []float64{5, 1, 3, 4}}
	if r.Median() != 3.5 || r.Min() != 1 || r.Max() != 5 {
		t.Fatalf("median %v min %v max %v", r.Median(), r.Min(), r.Max())
	}
	if (bench.Result{}).Median() != 0 {
		t.Fatal("empty median")
	}
}
