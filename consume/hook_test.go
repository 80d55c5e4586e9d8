package consume_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consume"
)

// endHook adapts a function to consume.DeliveryEndHook.
type endHook func(ctx context.Context, ev consume.Event)

func (f endHook) OnDeliveryEnd(ctx context.Context, ev consume.Event) { f(ctx, ev) }

type ctxKey string

// recorder is a start and end hook that records its calls and adds its
// name to the context's trail, so that tests can see which context reached
// whom.
type recorder struct {
	name string
	mu   *sync.Mutex
	log  *[]string
}

func trail(ctx context.Context) string {
	s, _ := ctx.Value(ctxKey("trail")).(string)
	return s
}

func (r recorder) record(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	*r.log = append(*r.log, s)
}

func (r recorder) OnDeliveryStart(ctx context.Context, ev consume.Event) context.Context {
	r.record(fmt.Sprintf("%s start %s key=%s attempt=%d outcome=%q trail=%s", r.name, ev.ID, ev.Key, ev.Attempt, ev.Outcome, trail(ctx)))
	return context.WithValue(ctx, ctxKey("trail"), trail(ctx)+r.name)
}

func (r recorder) OnDeliveryEnd(ctx context.Context, ev consume.Event) {
	reason := ""
	if ev.Reason != "" {
		reason = " " + string(ev.Reason)
	}
	r.record(fmt.Sprintf("%s end %s %s%s trail=%s", r.name, ev.ID, ev.Outcome, reason, trail(ctx)))
}

// hookLog returns n recorders named a, b, c... sharing one log.
func hookLog(n int) ([]idem.Hook, func() []string) {
	var mu sync.Mutex
	var log []string
	hooks := make([]idem.Hook, n)
	for i := range hooks {
		hooks[i] = recorder{name: string(rune('a' + i)), mu: &mu, log: &log}
	}
	return hooks, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(log)
	}
}

func wantLog(t *testing.T, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("hook calls\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// Start hooks run in order, each with the context the previous one
// returned; the handler and the end hooks get the last one.
func TestHooksThreadTheContext(t *testing.T) {
	t.Parallel()
	hooks, calls := hookLog(2)
	var counters consume.Counters
	// A value that implements no hook interface is ignored.
	hooks = append(hooks, "not a hook", &counters)
	var seen string
	e, _ := newEngine(t, newLedger().process(func(ctx context.Context, _ consume.Delivery) error {
		seen = trail(ctx)
		return nil
	}), func(c *consume.Config) { c.Hooks = hooks })
	if out, err := e.Handle(context.Background(), &fakeDelivery{id: "m1", body: []byte("x")}); out != idem.Processed || err != nil {
		t.Fatal(out, err)
	}
	if seen != "ab" {
		t.Fatalf("the handler ran with trail %q, want ab", seen)
	}
	wantLog(t, calls(), []string{
		`a start m1 key=m1 attempt=1 outcome="" trail=`,
		`b start m1 key=m1 attempt=1 outcome="" trail=a`,
		`a end m1 processed trail=ab`,
		`b end m1 processed trail=ab`,
	})
	if s := counters.Snapshot(); s.Processed != 1 {
		t.Fatalf("counters %+v", s)
	}
	// Deliveries without a key start and end too.
	hooks, calls = hookLog(1)
	e, _ = newEngine(t, newLedger().process(ok), func(c *consume.Config) { c.Hooks = hooks })
	e.Handle(context.Background(), &fakeDelivery{id: "café", state: consume.State{Attempts: 2}})
	wantLog(t, calls(), []string{
		`a start café key= attempt=3 outcome="" trail=`,
		`a end café dead_lettered invalid_id trail=a`,
	})
}

// A panic outside the handler (here, in the adapter's Ack) ends the
// delivery once, as Panicked, and goes on.
func TestEndHookOnceOnPanic(t *testing.T) {
	t.Parallel()
	hooks, calls := hookLog(2)
	e, _ := newEngine(t, newLedger().process(ok), func(c *consume.Config) { c.Hooks = hooks })
	d := &fakeDelivery{id: "m1", settleFn: func(string) error { panic("broker client bug") }}
	func() {
		defer func() {
			if p := recover(); p != "broker client bug" {
				t.Fatalf("recovered %v", p)
			}
		}()
		e.Handle(context.Background(), d)
		t.Fatal("the panic did not go on")
	}()
	wantLog(t, calls(), []string{
		`a start m1 key=m1 attempt=1 outcome="" trail=`,
		`b start m1 key=m1 attempt=1 outcome="" trail=a`,
		`a end m1 panicked trail=ab`,
		`b end m1 panicked trail=ab`,
	})
}

// A panicking end hook is not called again, and the other deliveries of a
// batch still end once.
func TestBatchHooksOnceOnPanic(t *testing.T) {
	t.Parallel()
	hooks, calls := hookLog(1)
	var ends int
	hooks = append(hooks, endHook(func(_ context.Context, ev consume.Event) {
		ends++
		if ev.ID == "a" {
			panic("hook bug")
		}
	}))
	l := newLedger()
	e, _ := newEngine(t, l.process(ok), func(c *consume.Config) { c.Hooks = hooks })
	func() {
		defer func() {
			if p := recover(); p != "hook bug" {
				t.Fatalf("recovered %v", p)
			}
		}()
		e.HandleBatch(context.Background(), deliveries([2]string{"a", "1"}, [2]string{"b", "2"}), l.batch(ok))
	}()
	wantLog(t, calls(), []string{
		`a start a key=a attempt=1 outcome="" trail=`,
		`a start b key=b attempt=1 outcome="" trail=`,
		`a end a processed trail=a`,
		`a end b panicked trail=a`,
	})
	if ends != 2 {
		t.Fatalf("the panicking hook was called %d times, want once per delivery", ends)
	}
}

// In a batch, every delivery starts once and ends once, whichever path
// settles it: no key, the batch's result, the one-by-one fallback, or a
// cancelled batch.
func TestBatchHooksOncePerDelivery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	hooks, calls := hookLog(1)
	l := newLedger()
	e, _ := newEngine(t, l.process(ok), func(c *consume.Config) { c.Hooks = hooks })
	e.Handle(ctx, &fakeDelivery{id: "old", body: []byte("o")})
	var batchTrail string
	process := func(ctx context.Context, msgs []idem.Message, ds []consume.Delivery) ([]idem.Outcome, error) {
		batchTrail = trail(ctx)
		return l.batch(ok)(ctx, msgs, ds)
	}
	e.HandleBatch(ctx, deliveries([2]string{"a", "1"}, [2]string{"", "x"}, [2]string{"old", "changed"}), process)
	if batchTrail != "" {
		t.Fatalf("the batch ran with trail %q: it serves many deliveries, so it gets HandleBatch's context", batchTrail)
	}
	wantLog(t, calls(), []string{
		`a start old key=old attempt=1 outcome="" trail=`,
		`a end old processed trail=a`,
		`a start a key=a attempt=1 outcome="" trail=`,
		`a start  key= attempt=1 outcome="" trail=`,
		`a end  dead_lettered missing_id trail=a`,
		`a start old key=old attempt=1 outcome="" trail=`,
		`a end a processed trail=a`,
		`a end old dead_lettered mismatch trail=a`,
	})

	// The fallback handles each delivery again without starting it again.
	hooks, calls = hookLog(1)
	poison := func(_ context.Context, d consume.Delivery) error {
		if d.ID() == "bad" {
			return errors.New("cannot apply")
		}
		return nil
	}
	l = newLedger()
	e, _ = newEngine(t, l.process(poison), func(c *consume.Config) { c.Hooks = hooks })
	outs, _ := e.HandleBatch(ctx, deliveries([2]string{"ok", "1"}, [2]string{"bad", "2"}), l.batch(poison))
	if fmt.Sprint(outs) != "[processed retried]" {
		t.Fatal(outs)
	}
	wantLog(t, calls(), []string{
		`a start ok key=ok attempt=1 outcome="" trail=`,
		`a start bad key=bad attempt=1 outcome="" trail=`,
		`a end ok processed trail=a`,
		`a end bad retried trail=a`,
	})

	// A cancelled batch ends its deliveries as abandoned, with the error.
	hooks, calls = hookLog(1)
	var errs []error
	hooks = append(hooks, endHook(func(_ context.Context, ev consume.Event) { errs = append(errs, ev.Err) }))
	e, _ = newEngine(t, l.process(ok), func(c *consume.Config) { c.Hooks = hooks })
	cctx, cancel := context.WithCancel(ctx)
	e.HandleBatch(cctx, deliveries([2]string{"c", "1"}), func(ctx context.Context, _ []idem.Message, _ []consume.Delivery) ([]idem.Outcome, error) {
		cancel()
		return nil, ctx.Err()
	})
	wantLog(t, calls(), []string{
		`a start c key=c attempt=1 outcome="" trail=`,
		`a end c abandoned trail=a`,
	})
	if len(errs) != 1 || !errors.Is(errs[0], context.Canceled) {
		t.Fatalf("errors %v", errs)
	}
}
