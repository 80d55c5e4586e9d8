package hooktest

import (
	"context"
	"fmt"
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
		want    idem.Outcome
		settled string
	}{
		{NewDelivery("m1", "a"), idem.Processed, "ack"},
		{NewDelivery("m1", "a"), idem.Duplicate, "ack"},
		{NewDelivery("", "no id"), idem.DeadLettered, "dead-letter"},
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
	DriveConsume(t, context.Background(), []idem.Hook{deliveryEnd(func(_ context.Context, ev consume.Event) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, fmt.Sprintf("%s %s %d %s %s", ev.Consumer, ev.ID, ev.Attempt, ev.Outcome, ev.Reason))
	})})
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
	h := ServeIdem(t, []idem.Hook{requestEnd(func(_ context.Context, ev idemhttp.Event) {
		mu.Lock()
		defer mu.Unlock()
		outcomes = append(outcomes, ev.Outcome)
		patterns = append(patterns, ev.Request.Pattern)
	})})
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
		drive func(hooks []idem.Hook)
		want  []string
	}{
		"DriveInbox": {func(hooks []idem.Hook) { DriveInbox(context.Background(), hooks) }, []string{
			"order.created processed", "order.created processed", "order.created retried",
			"order.paid dead_lettered/max_attempts", "order.paid released", "order.paid unknown_outcome",
			"order.shipped lease_lost", "spam.1 processed", "spam.2 processed",
		}},
		"NewWorker": {func(hooks []idem.Hook) {
			if n, err := NewWorker(t, hooks).RunOnce(context.Background()); err != nil || n != 6 {
				t.Errorf("RunOnce: %d, %v", n, err)
			}
		}, []string{
			"order.created processed", "order.failing retried", "order.permanent dead_lettered/permanent",
			"order.created lease_lost", "order.unknown dead_lettered/no_handler", "order.failing dead_lettered/max_attempts",
		}},
	} {
		var mu sync.Mutex
		var got []string
		c.drive([]idem.Hook{runEnd(func(_ context.Context, ev inbox.Event) {
			mu.Lock()
			defer mu.Unlock()
			s := ev.Message.Type + " " + ev.Outcome.String()
			if ev.DeadReason != "" {
				s += "/" + ev.DeadReason.String()
			}
			got = append(got, s)
		})})
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: events %q, want %q", name, got, c.want)
		}
	}
}

func TestDriveGuard(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got []idem.Outcome
	g := NewGuard(idemtest.NewMemoryStore(nil), []idem.Hook{doEnd(func(_ context.Context, ev idem.DoEvent) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, ev.Outcome)
	})})
	DriveGuard(t, context.Background(), g)
	want := []idem.Outcome{idem.Processed, idem.Duplicate, idem.Duplicate, idem.Mismatch, idem.Released}
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
	ReportConcurrently(goroutines, each, func(name string) idem.Hook {
		return &allHooks{count: count, name: name}
	})
	for _, hook := range []string{"consume", "inbox", "http", "guard"} {
		if calls[hook+" start"] != goroutines*each || calls[hook] != goroutines*each {
			t.Errorf("%s called %d times (start %d), want %d", hook, calls[hook], calls[hook+" start"], goroutines*each)
		}
	}
	if len(names) != 2*4*16 || !names["consume c15"] || !names["http POST /r15"] || !names["guard c15"] {
		t.Errorf("names %v, want 16 for each hook", names)
	}
	// A value that implements no hook is skipped.
	ReportConcurrently(2, 2, func(string) idem.Hook { return struct{}{} })
}

// allHooks implements every hook; each start hook leaves its name in the
// context, which the end hook checks.
type allHooks struct {
	count func(hook, name string)
	name  string
}

type startKey struct{}

func (h *allHooks) start(ctx context.Context, hook, name string) context.Context {
	h.count(hook+" start", name)
	return context.WithValue(ctx, startKey{}, hook)
}

func (h *allHooks) end(ctx context.Context, hook, name string) {
	if ctx.Value(startKey{}) != hook {
		name = "without its start context"
	}
	h.count(hook, name)
}

func (h *allHooks) OnDeliveryStart(ctx context.Context, ev consume.Event) context.Context {
	return h.start(ctx, "consume", ev.Consumer)
}
func (h *allHooks) OnDeliveryEnd(ctx context.Context, ev consume.Event) {
	h.end(ctx, "consume", ev.Consumer)
}
func (h *allHooks) OnRunStart(ctx context.Context, ev inbox.Event) context.Context {
	return h.start(ctx, "inbox", ev.Message.Type)
}
func (h *allHooks) OnRunEnd(ctx context.Context, ev inbox.Event) {
	h.end(ctx, "inbox", ev.Message.Type)
}
func (h *allHooks) OnRequestStart(ctx context.Context, ev idemhttp.Event) context.Context {
	return h.start(ctx, "http", ev.Request.Pattern)
}
func (h *allHooks) OnRequestEnd(ctx context.Context, ev idemhttp.Event) {
	h.end(ctx, "http", ev.Request.Pattern)
}
func (h *allHooks) OnDoStart(ctx context.Context, _ idem.DoEvent) context.Context {
	return h.start(ctx, "guard", h.name)
}
func (h *allHooks) OnDoEnd(ctx context.Context, _ idem.DoEvent) { h.end(ctx, "guard", h.name) }

type deliveryEnd func(context.Context, consume.Event)

func (f deliveryEnd) OnDeliveryEnd(ctx context.Context, ev consume.Event) { f(ctx, ev) }

type runEnd func(context.Context, inbox.Event)

func (f runEnd) OnRunEnd(ctx context.Context, ev inbox.Event) { f(ctx, ev) }

type requestEnd func(context.Context, idemhttp.Event)

func (f requestEnd) OnRequestEnd(ctx context.Context, ev idemhttp.Event) { f(ctx, ev) }

type doEnd func(context.Context, idem.DoEvent)

func (f doEnd) OnDoEnd(ctx context.Context, ev idem.DoEvent) { f(ctx, ev) }
