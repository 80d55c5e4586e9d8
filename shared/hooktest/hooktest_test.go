package hooktest

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/inbox"
)

// The tests below pin what the drivers' documentation promises, since the
// metrics modules' tests assert series from it.

func TestDelivery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := NewEngine(t, nil, "payments", func(context.Context, idem.Run, consume.Delivery) error { return nil })
	for _, c := range []struct {
		d       *Delivery
		want    consume.Outcome
		settled string
	}{
		{NewDelivery("m1", "a"), consume.OutcomeProcessed, "ack"},
		{NewDelivery("m1", "a"), consume.OutcomeDuplicate, "ack"},
		{NewDelivery("", "no id"), consume.OutcomeDeadLettered, "dead-letter"},
	} {
		Handle(t, ctx, e, c.d, c.want)
		if got := c.d.Settled(); got != c.settled {
			t.Errorf("%s delivery %q settled by %q, want %q", c.want, c.d.ID(), got, c.settled)
		}
	}
}

func TestDriveConsume(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got []string
	DriveConsume(t, context.Background(), consume.HooksFunc(func(_ context.Context, ev consume.Event) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, fmt.Sprintf("%s %s %d %s %s", ev.Consumer, ev.ID, ev.Attempt, ev.Outcome, ev.Reason))
	}))
	want := []string{
		"payments pay-secret-1 1 processed ",
		"payments pay-secret-1 1 duplicate ",
		"payments pay-secret-2 1 processed ",
		"payments  1 dead_lettered missing_id",
		"refunds refund-secret 1 retried ",
		"refunds refund-secret 2 retried ",
		"refunds refund-secret 3 dead_lettered max_attempts",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("events\n%q\nwant\n%q", got, want)
	}
}

func TestDriveHTTP(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var outcomes []idem.Outcome
	var patterns []string
	h := ServeIdem(t, func(r *http.Request, ev idemhttp.Event) {
		mu.Lock()
		defer mu.Unlock()
		outcomes = append(outcomes, ev.Outcome)
		patterns = append(patterns, r.Pattern)
	})
	DriveHTTP(t, h)
	want := []idem.Outcome{
		idem.Processed, idem.Duplicate, idem.Mismatch,
		idem.Rejected, idem.Released,
	}
	if !slices.Equal(outcomes, want) {
		t.Fatalf("outcomes %v, want %v", outcomes, want)
	}
	for _, p := range patterns {
		if p != Route {
			t.Errorf("pattern %q, want %q", p, Route)
		}
	}
}

func TestInboxDrivers(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		drive func(hook func(inbox.Event))
		want  []string
	}{
		"DriveInbox": {DriveInbox, []string{
			"order.created processed", "order.created processed", "order.created retried",
			"order.paid dead", "order.paid released", "order.paid Outcome(99)",
			"order.shipped lease_lost", "spam.1 processed", "spam.2 processed",
		}},
		"NewWorker": {func(hook func(inbox.Event)) {
			if n, err := NewWorker(t, hook).RunOnce(context.Background()); err != nil || n != 6 {
				t.Errorf("RunOnce: %d, %v", n, err)
			}
		}, []string{
			"order.created processed", "order.failing retried", "order.permanent dead",
			"order.created lease_lost", "order.unknown dead", "order.failing dead",
		}},
	} {
		var mu sync.Mutex
		var got []string
		c.drive(func(ev inbox.Event) {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, ev.Message.Type+" "+ev.Outcome.String())
		})
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: events %q, want %q", name, got, c.want)
		}
	}
}

func TestDriveGuard(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got []idem.DoOutcome
	g := NewGuard(idemtest.NewMemoryStore(nil), func(_ context.Context, ev idem.DoEvent) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, ev.Outcome)
	})
	DriveGuard(t, context.Background(), g)
	want := []idem.DoOutcome{idem.DoExecuted, idem.DoReplayed, idem.DoReplayed, idem.DoMismatch, idem.DoFailed}
	if !slices.Equal(got, want) {
		t.Fatalf("outcomes %v, want %v", got, want)
	}
}

// recorder is a testing.TB that keeps its errors instead of failing.
type recorder struct {
	testing.TB
	errors int
}

func (r *recorder) Helper()               {}
func (r *recorder) Errorf(string, ...any) { r.errors++ }

func TestWantCounts(t *testing.T) {
	t.Parallel()
	got := map[string]float64{"a": 1, "b": 0, "extra": 5}
	for _, c := range []struct {
		want   map[string]float64
		errors int
	}{
		{map[string]float64{"a": 1, "b": 0}, 0},
		{map[string]float64{"a": 2}, 1},
		{map[string]float64{"missing": 0}, 1}, // absent is not zero
		{map[string]float64{"a": 1, "b": 1, "c": 0}, 2},
	} {
		r := &recorder{TB: t}
		WantCounts(r, got, c.want)
		if r.errors != c.errors {
			t.Errorf("WantCounts(%v): %d errors, want %d", c.want, r.errors, c.errors)
		}
	}
}

func TestReportConcurrently(t *testing.T) {
	t.Parallel()
	const goroutines, each = 20, 3
	var mu sync.Mutex
	calls := map[string]int{}
	names := map[string]bool{}
	count := func(hook, name string) {
		mu.Lock()
		defer mu.Unlock()
		calls[hook]++
		names[hook+" "+name] = true
	}
	ReportConcurrently(goroutines, each, Hooks{
		Consume: consume.HooksFunc(func(_ context.Context, ev consume.Event) { count("consume", ev.Consumer) }),
		Inbox:   func(ev inbox.Event) { count("inbox", ev.Message.Type) },
		HTTP:    func(r *http.Request, _ idemhttp.Event) { count("http", r.Pattern) },
		Guard: func(name string) func(context.Context, idem.DoEvent) {
			return func(context.Context, idem.DoEvent) { count("guard", name) }
		},
	})
	for _, hook := range []string{"consume", "inbox", "http", "guard"} {
		if calls[hook] != goroutines*each {
			t.Errorf("%s called %d times, want %d", hook, calls[hook], goroutines*each)
		}
	}
	if len(names) != 4*16 || !names["consume c15"] || !names["http POST /r15"] {
		t.Errorf("names %v, want 16 for each hook", names)
	}
	// Nil hooks are skipped.
	ReportConcurrently(2, 2, Hooks{})
}
