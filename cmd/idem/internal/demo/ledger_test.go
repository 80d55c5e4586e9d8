package demo

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

func TestDemoStream(t *testing.T) {
	t.Parallel()
	s := newDemoStream(1, 400)
	if len(s.Payments) != 400 || len(s.Deliveries) != 400+2*s.Tripled {
		t.Fatalf("%d payments, %d deliveries, %d tripled", len(s.Payments), len(s.Deliveries), s.Tripled)
	}
	if s.Tripled < 60 || s.Tripled > 140 {
		t.Fatalf("%d of 400 payments tripled, want about a quarter", s.Tripled)
	}
	count := map[string]int{}
	for _, d := range s.Deliveries {
		count[d.ID]++
	}
	for _, p := range s.Payments {
		if n := count[p.ID]; n != 1 && n != 3 {
			t.Fatalf("%s delivered %d times", p.ID, n)
		}
		if p.Cents < 1 || p.Cents > 50000 {
			t.Fatalf("%s amount %d cents", p.ID, p.Cents)
		}
	}
	if t2 := newDemoStream(1, 400); t2.expected() != s.expected() || t2.Deliveries[17] != s.Deliveries[17] {
		t.Fatal("same seed, different stream")
	}
	if t3 := newDemoStream(2, 400); t3.expected() == s.expected() {
		t.Fatal("different seed, same amounts")
	}
}

// TestDeliverCrashRedelivers: the delivery at CrashAt is handed over once
// more at the end, so a naive consumer applies it twice.
func TestDeliverCrashRedelivers(t *testing.T) {
	t.Parallel()
	s := newDemoStream(9, 50)
	var seen []payment
	st, err := deliver(t.Context(), s, func(_ context.Context, p payment) (bool, error) {
		seen = append(seen, p)
		return false, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if st.Deliveries != len(s.Deliveries)+1 || len(seen) != st.Deliveries || seen[len(seen)-1] != s.Deliveries[s.CrashAt] {
		t.Fatalf("%d deliveries of %d, last %v, crashed %v", st.Deliveries, len(s.Deliveries), seen[len(seen)-1], s.Deliveries[s.CrashAt])
	}
	boom := errors.New("boom")
	_, err = deliver(t.Context(), s, func(context.Context, payment) (bool, error) { return false, boom })
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "delivery 1") {
		t.Fatalf("deliver error = %v", err)
	}
}

func TestDeliverConcurrently(t *testing.T) {
	t.Parallel()
	s := newDemoStream(5, 300)
	var (
		mu      sync.Mutex
		applied = map[string]bool{}
	)
	// An in-memory dedupe under a mutex stands in for the database here;
	// this test is about the fan-out, not the store.
	st, err := deliverConcurrently(t.Context(), s, 16, func(_ context.Context, p payment) (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		dup := applied[p.ID]
		applied[p.ID] = true
		return dup, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if st.Deliveries != len(s.Deliveries)+1 || st.Skipped != st.Deliveries-len(s.Payments) || len(applied) != len(s.Payments) {
		t.Fatalf("stats %+v, %d applied, %d payments", st, len(applied), len(s.Payments))
	}

	boom := errors.New("boom")
	var calls atomic.Int64
	_, err = deliverConcurrently(t.Context(), s, 8, func(context.Context, payment) (bool, error) {
		if calls.Add(1) == 10 {
			return false, boom
		}
		return false, nil
	})
	if !errors.Is(err, boom) {
		t.Fatalf("deliverConcurrently error = %v, want boom", err)
	}
}

func TestVerdict(t *testing.T) {
	t.Parallel()
	good := demoResult{Messages: 100, Deliveries: 151, Expected: 123456, Naive: 200000, Idem: 123456, Skipped: 51,
		Workers: 8, Concurrent: 123456, ConcurrentSkipped: 51}
	if err := verdict(good); err != nil {
		t.Fatalf("verdict(exact) = %v", err)
	}
	seq := good
	seq.Workers, seq.Concurrent, seq.ConcurrentSkipped = 0, 0, 0
	if err := verdict(seq); err != nil {
		t.Fatalf("verdict(exact, no concurrent run) = %v", err)
	}
	tests := []struct {
		name   string
		change func(*demoResult)
		want   string
	}{
		{"idem applied a duplicate", func(r *demoResult) { r.Idem += 500 }, "idem balance $1,239.56, expected $1,234.56"},
		{"idem lost a payment", func(r *demoResult) { r.Idem -= 1 }, "idem balance $1,234.55"},
		{"skipped too few", func(r *demoResult) { r.Skipped = 50 }, "idem skipped 50 duplicates of 51"},
		{"concurrent balance", func(r *demoResult) { r.Concurrent = 0 }, "idem balance with 8 workers $0.00"},
		{"concurrent skipped", func(r *demoResult) { r.ConcurrentSkipped = 52 }, "skipped 52 duplicates of 51"},
		{"naive numbers for idem", func(r *demoResult) { r.Idem = r.Naive }, "idem balance $2,000.00"},
	}
	for _, tt := range tests {
		r := good
		tt.change(&r)
		err := verdict(r)
		if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.HasPrefix(err.Error(), "demo failed: ") {
			t.Errorf("%s: verdict = %v, want an error with %q", tt.name, err, tt.want)
		}
	}
}

func TestWriteTableMarksWrongBalances(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	writeTable(&b, demoResult{Messages: 2, Deliveries: 4, Tripled: 1, Expected: 300, Naive: 500, Idem: 400, Skipped: 1, Workers: 2, Concurrent: 300, ConcurrentSkipped: 2})
	out := b.String()
	for _, w := range []string{"WRONG by $1.00", "exact", "wrong by $2.00", "of 2; 2 with 2 workers", "1 messages delivered 3×"} {
		if !strings.Contains(out, w) {
			t.Errorf("table lacks %q:\n%s", w, out)
		}
	}
	// Values are right-aligned in one column.
	col := -1
	for line := range strings.SplitSeq(strings.TrimRight(out, "\n"), "\n") {
		end := len(strings.TrimRight(line[:min(len(line), 43)], " "))
		if col == -1 {
			col = end
		} else if end != col {
			t.Errorf("misaligned row %q (value ends at %d, want %d)", line, end, col)
		}
	}
}

func TestDollars(t *testing.T) {
	t.Parallel()
	tests := map[int64]string{0: "$0.00", 5: "$0.05", 100: "$1.00", 123456: "$1,234.56", 100000000: "$1,000,000.00", -250: "-$2.50", 99999: "$999.99"}
	for in, want := range tests {
		if got := dollars(in); got != want {
			t.Errorf("dollars(%d) = %q, want %q", in, got, want)
		}
	}
}
