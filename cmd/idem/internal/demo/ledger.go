package demo

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
)

// payment is one message of the demo: credit Cents to the ledger.
type payment struct {
	ID    string
	Cents int64
}

// demoStream is what the simulated broker delivers: the payments, and the
// order of their deliveries with duplicates.
type demoStream struct {
	Payments   []payment
	Deliveries []payment
	// Tripled is how many payments are delivered three times.
	Tripled int
	// CrashAt is the index of the delivery after whose commit the consumer
	// crashes before acknowledging it: the broker delivers it once more at
	// the end of the stream.
	CrashAt int
}

// newDemoStream builds the stream for seed: n payments of $0.01–$500.00,
// about one in four delivered three times (a producer retry and a broker
// redelivery), shuffled. The same seed always gives the same stream.
func newDemoStream(seed uint64, n int) demoStream {
	r := rand.New(rand.NewPCG(seed, 0x1de3))
	var s demoStream
	for i := range n {
		p := payment{ID: "pay-" + strconv.Itoa(i+1), Cents: 1 + r.Int64N(50000)}
		s.Payments = append(s.Payments, p)
		s.Deliveries = append(s.Deliveries, p)
		if r.IntN(4) == 0 {
			s.Tripled++
			s.Deliveries = append(s.Deliveries, p, p)
		}
	}
	r.Shuffle(len(s.Deliveries), func(i, j int) {
		s.Deliveries[i], s.Deliveries[j] = s.Deliveries[j], s.Deliveries[i]
	})
	s.CrashAt = len(s.Deliveries) / 2
	return s
}

// expected is the balance when every payment is applied exactly once.
func (s demoStream) expected() int64 {
	var sum int64
	for _, p := range s.Payments {
		sum += p.Cents
	}
	return sum
}

// consumer applies one delivered payment to the ledger. skipped reports a
// duplicate it recognised and did not apply.
type consumer func(ctx context.Context, p payment) (skipped bool, err error)

// deliveryStats is what a consumer did with the stream.
type deliveryStats struct {
	Deliveries int
	Skipped    int
}

// deliver plays the broker: it hands every delivery to c in order and, at
// s.CrashAt, simulates a consumer that committed its effect and crashed
// before the ack, so the broker delivers that message once more.
func deliver(ctx context.Context, s demoStream, c consumer) (deliveryStats, error) {
	queue := append([]payment(nil), s.Deliveries...)
	var st deliveryStats
	for i := 0; i < len(queue); i++ {
		skipped, err := c(ctx, queue[i])
		if err != nil {
			return st, fmt.Errorf("delivery %d (%s): %w", i+1, queue[i].ID, err)
		}
		st.Deliveries++
		if skipped {
			st.Skipped++
		}
		if i == s.CrashAt {
			// Committed, not acked: the broker never heard back.
			queue = append(queue, queue[i])
		}
	}
	return st, nil
}

// deliverConcurrently hands the same deliveries as deliver (the crash's
// redelivery included) to c from workers goroutines at once. The copies of
// a payment are queued back to back, so they reach different goroutines at
// the same moment and race each other: only the database can settle that.
func deliverConcurrently(ctx context.Context, s demoStream, workers int, c consumer) (deliveryStats, error) {
	all := append(append([]payment(nil), s.Deliveries...), s.Deliveries[s.CrashAt])
	copies := map[string][]payment{}
	var order []string
	for _, p := range all {
		if copies[p.ID] == nil {
			order = append(order, p.ID)
		}
		copies[p.ID] = append(copies[p.ID], p)
	}
	queue := make([]payment, 0, len(all))
	for _, id := range order {
		queue = append(queue, copies[id]...)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	work := make(chan payment)
	var (
		mu       sync.Mutex
		st       deliveryStats
		firstErr error
		wg       sync.WaitGroup
	)
	for range workers {
		wg.Go(func() {
			for p := range work {
				skipped, err := c(ctx, p)
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = fmt.Errorf("%s: %w", p.ID, err)
					cancel()
				}
				if err == nil {
					st.Deliveries++
					if skipped {
						st.Skipped++
					}
				}
				mu.Unlock()
			}
		})
	}
feed:
	for _, p := range queue {
		select {
		case work <- p:
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
	if firstErr == nil && ctx.Err() != nil {
		firstErr = ctx.Err()
	}
	return st, firstErr
}

// demoResult is the outcome of one demo run.
type demoResult struct {
	Messages   int
	Deliveries int
	Tripled    int
	Expected   int64
	Naive      int64
	Idem       int64
	// Skipped is the duplicates the sequential idem consumer skipped.
	Skipped int
	// Workers, Concurrent and ConcurrentSkipped describe the concurrent
	// idem run (Workers 0: not run).
	Workers           int
	Concurrent        int64
	ConcurrentSkipped int
}

// verdict returns nil when the idem consumer applied every payment exactly
// once, in both runs, and an error saying what went wrong otherwise.
func verdict(r demoResult) error {
	dups := r.Deliveries - r.Messages
	var bad []string
	if r.Idem != r.Expected {
		bad = append(bad, fmt.Sprintf("idem balance %s, expected %s", dollars(r.Idem), dollars(r.Expected)))
	}
	if r.Skipped != dups {
		bad = append(bad, fmt.Sprintf("idem skipped %d duplicates of %d", r.Skipped, dups))
	}
	if r.Workers > 0 {
		if r.Concurrent != r.Expected {
			bad = append(bad, fmt.Sprintf("idem balance with %d workers %s, expected %s", r.Workers, dollars(r.Concurrent), dollars(r.Expected)))
		}
		if r.ConcurrentSkipped != dups {
			bad = append(bad, fmt.Sprintf("idem with %d workers skipped %d duplicates of %d", r.Workers, r.ConcurrentSkipped, dups))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("demo failed: %s", strings.Join(bad, "; "))
	}
	return nil
}

// writeTable prints r as the demo's aligned table.
func writeTable(w io.Writer, r demoResult) {
	row := func(label, value, note string) { tableRow(w, label, value, note) }
	dups := r.Deliveries - r.Messages
	row("messages", strconv.Itoa(r.Messages), "")
	row("deliveries", strconv.Itoa(r.Deliveries),
		fmt.Sprintf("%d messages delivered 3×, 1 redelivered after a crash", r.Tripled))
	row("expected balance", dollars(r.Expected), "")
	naiveNote := ""
	if d := r.Naive - r.Expected; d != 0 {
		naiveNote = fmt.Sprintf("wrong by %s", dollars(d))
	}
	row("naive balance", dollars(r.Naive), naiveNote)
	row("idem balance", dollars(r.Idem), exactNote(r.Idem, r.Expected))
	if r.Workers > 0 {
		row(fmt.Sprintf("idem balance, %d workers", r.Workers), dollars(r.Concurrent), exactNote(r.Concurrent, r.Expected))
	}
	skipNote := fmt.Sprintf("of %d", dups)
	if r.Workers > 0 {
		skipNote += fmt.Sprintf("; %d with %d workers", r.ConcurrentSkipped, r.Workers)
	}
	row("duplicates skipped", strconv.Itoa(r.Skipped), skipNote)
}

// tableRow prints one row of the demo's tables: values right-aligned in
// one column, then an optional note.
func tableRow(w io.Writer, label, value, note string) {
	line := fmt.Sprintf("  %-26s %14s", label, value)
	if note != "" {
		line += "   " + note
	}
	fmt.Fprintln(w, line)
}

func exactNote(got, want int64) string {
	if got == want {
		return "exact"
	}
	return fmt.Sprintf("WRONG by %s", dollars(got-want))
}

// dollars formats cents as $1,234.56 (with a sign when negative).
func dollars(cents int64) string {
	sign := ""
	if cents < 0 {
		sign, cents = "-", -cents
	}
	whole := strconv.FormatInt(cents/100, 10)
	var b strings.Builder
	for i, c := range whole {
		if i > 0 && (len(whole)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return fmt.Sprintf("%s$%s.%02d", sign, b.String(), cents%100)
}
