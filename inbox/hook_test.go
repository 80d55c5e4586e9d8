package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/inbox/inboxtest"
	"github.com/idem-go/idem/retry"
)

type hookKey string

// recorder logs the calls of both hooks. Its start hook puts its name in
// the context; its end hook logs which names the context holds.
type recorder struct {
	name string
	mu   *sync.Mutex
	log  *[]string
}

func (r recorder) add(s string) {
	r.mu.Lock()
	*r.log = append(*r.log, s)
	r.mu.Unlock()
}

func names(ctx context.Context) string {
	var got []string
	for _, n := range []string{"a", "b"} {
		if ctx.Value(hookKey(n)) != nil {
			got = append(got, n)
		}
	}
	return "[" + strings.Join(got, " ") + "]"
}

func (r recorder) OnRunStart(ctx context.Context, ev inbox.Event) context.Context {
	r.add(fmt.Sprintf("%s start %s %s %s", r.name, ev.Message.ID, ev.Outcome, names(ctx)))
	return context.WithValue(ctx, hookKey(r.name), true)
}

func (r recorder) OnRunEnd(ctx context.Context, ev inbox.Event) {
	s := fmt.Sprintf("%s end %s %s %s", r.name, ev.Message.ID, ev.Outcome, names(ctx))
	if ev.DeadReason != "" {
		s += "/" + ev.DeadReason.String()
	}
	r.add(s)
}

// newHookWorker returns a worker over b with two recorders as hooks and
// handlers for the types ok, flaky, bad (permanent), outage (retryable) and
// panics; lease 0 means the default.
func newHookWorker(t *testing.T, b *inboxtest.Memory, handlerSaw *[]string, lease time.Duration) (*inbox.Worker[struct{}], *[]string) {
	t.Helper()
	var mu sync.Mutex
	var log []string
	w, err := inbox.NewWorker[struct{}](b, &inbox.Config{
		Workers: 1, PurgeInterval: -1, Lease: lease, Logger: slog.New(slog.DiscardHandler),
		Retry: &retry.Policy{MaxAttempts: 2},
		// The string is neither hook: it is ignored.
		Hooks: []idem.Hook{recorder{"a", &mu, &log}, "not a hook", recorder{"b", &mu, &log}},
	})
	if err != nil {
		t.Fatal(err)
	}
	handle := func(err error) inbox.Handler[struct{}] {
		return func(ctx context.Context, _ struct{}, m inbox.Message) error {
			*handlerSaw = append(*handlerSaw, m.ID+" "+names(ctx))
			return err
		}
	}
	for typ, h := range map[string]inbox.Handler[struct{}]{
		"ok": handle(nil), "flaky": handle(errors.New("flaky")), "bad": handle(fmt.Errorf("decode: %w", retry.Permanent(errors.New("bad")))),
		"outage": handle(idem.Retryable(errors.New("database down"))),
		"panics": func(context.Context, struct{}, inbox.Message) error { panic("handler bug") },
	} {
		if err := w.Handle(typ, h); err != nil {
			t.Fatal(err)
		}
	}
	return w, &log
}

func hookRow(id int64, typ string, attempts int) inbox.Row {
	return inbox.Row{ID: id, Source: "s", MessageID: fmt.Sprintf("m%d", id), Type: typ, Attempts: attempts, Token: 1}
}

// The start hooks run in order before the handler, which runs with the
// context they return; the end hooks run once per run, in order, with that
// context and the outcome.
func TestHooksPerRun(t *testing.T) {
	t.Parallel()
	b := &inboxtest.Memory{
		Rows: []inbox.Row{hookRow(1, "ok", 0), hookRow(2, "flaky", 0), hookRow(3, "flaky", 1), hookRow(4, "bad", 0),
			hookRow(5, "unknown", 0), hookRow(6, "ok", 0), hookRow(7, "panics", 0)},
		Lost: map[int64]bool{6: true},
	}
	var saw []string
	w, log := newHookWorker(t, b, &saw, 0)
	if n, err := w.RunOnce(context.Background()); err != nil || n != 7 {
		t.Fatalf("RunOnce = %d, %v", n, err)
	}
	var want []string
	for _, run := range []struct{ id, end string }{
		{"m1", "processed"}, {"m2", "retried"}, {"m3", "dead_lettered"}, {"m4", "dead_lettered"},
		{"m5", "dead_lettered"}, {"m6", "lease_lost"}, {"m7", "retried"},
	} {
		reason := map[string]string{"m3": "/max_attempts", "m4": "/permanent", "m5": "/no_handler"}[run.id]
		want = append(want, "a start "+run.id+"  []", "b start "+run.id+"  [a]",
			"a end "+run.id+" "+run.end+" [a b]"+reason, "b end "+run.id+" "+run.end+" [a b]"+reason)
	}
	if !slices.Equal(*log, want) {
		t.Errorf("hook calls:\n%s\nwant:\n%s", strings.Join(*log, "\n"), strings.Join(want, "\n"))
	}
	if wantSaw := []string{"m1 [a b]", "m2 [a b]", "m3 [a b]", "m4 [a b]"}; !slices.Equal(saw, wantSaw) {
		t.Errorf("handlers saw %q, want %q", saw, wantSaw)
	}
}

// A panic of the worker itself (here the backend's) ends the run with
// idem.Panicked before it goes on.
func TestHooksEndOnPanic(t *testing.T) {
	t.Parallel()
	b := &inboxtest.Memory{Rows: []inbox.Row{hookRow(1, "ok", 0)}, Panics: map[int64]bool{1: true}}
	var saw []string
	w, log := newHookWorker(t, b, &saw, 0)
	func() {
		defer func() {
			if p := recover(); p != "inboxtest: memory backend panics on purpose" {
				t.Errorf("recovered %v, want the backend's panic", p)
			}
		}()
		_, _ = w.RunOnce(context.Background())
	}()
	want := []string{"a start m1  []", "b start m1  [a]", "a end m1 panicked [a b]", "b end m1 panicked [a b]"}
	if !slices.Equal(*log, want) {
		t.Errorf("hook calls %q, want %q", *log, want)
	}
}

// Rows given back on stop did not run: each is reported, start then end,
// as released.
func TestHooksReleasedRows(t *testing.T) {
	t.Parallel()
	b := &inboxtest.Memory{Rows: []inbox.Row{hookRow(1, "ok", 0), hookRow(2, "ok", 0)}}
	var saw []string
	w, log := newHookWorker(t, b, &saw, 0)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if n, err := w.RunOnce(ctx); err != nil || n != 2 {
		t.Fatalf("RunOnce = %d, %v", n, err)
	}
	var want []string
	for _, id := range []string{"m1", "m2"} {
		want = append(want, "a start "+id+"  []", "b start "+id+"  [a]", "a end "+id+" released [a b]", "b end "+id+" released [a b]")
	}
	if !slices.Equal(*log, want) || len(saw) != 0 {
		t.Errorf("hook calls %q (handlers ran: %q), want %q", *log, saw, want)
	}
}

// A hard stop cancels a running handler: the run ends released, or
// abandoned when the row cannot be given back.
func TestHooksHardStop(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		releaseErr error
		want       string
	}{{nil, "released"}, {errors.New("database down"), "abandoned"}} {
		b := &inboxtest.Memory{Rows: []inbox.Row{hookRow(1, "wait", 0)}, ReleaseErr: c.releaseErr}
		var saw []string
		w, log := newHookWorker(t, b, &saw, 0)
		ctx, cancel := context.WithCancel(context.Background())
		if err := w.Handle("wait", func(ctx context.Context, _ struct{}, _ inbox.Message) error {
			cancel()
			<-ctx.Done()
			return ctx.Err()
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := w.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		want := []string{"a start m1  []", "b start m1  [a]", "a end m1 " + c.want + " [a b]", "b end m1 " + c.want + " [a b]"}
		if !slices.Equal(*log, want) {
			t.Errorf("release error %v: hook calls %q, want %q", c.releaseErr, *log, want)
		}
	}
}

// What the worker asks the backend to record for each kind of failure
// (MaxAttempts 2): an infrastructure error is never counted nor dead, even
// on the last attempt.
func TestFailRequests(t *testing.T) {
	t.Parallel()
	b := &inboxtest.Memory{Rows: []inbox.Row{hookRow(1, "flaky", 0), hookRow(2, "flaky", 1), hookRow(3, "bad", 0),
		hookRow(4, "outage", 1), hookRow(5, "unknown", 0)}}
	var saw []string
	w, _ := newHookWorker(t, b, &saw, 0)
	if _, err := w.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range b.Fails() {
		got = append(got, fmt.Sprintf("%d dead=%v/%s uncounted=%v delayed=%v %s", f.ID, f.Dead, f.DeadReason, f.Uncounted, f.Delay > 0, f.Error))
	}
	want := []string{
		"1 dead=false/ uncounted=false delayed=true flaky",
		"2 dead=true/max_attempts uncounted=false delayed=false flaky",
		"3 dead=true/permanent uncounted=false delayed=false bad [from decode]", // the root cause first
		"4 dead=false/ uncounted=true delayed=true database down",
		`5 dead=true/no_handler uncounted=false delayed=false no handler registered for event type "unknown"`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("fail requests:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// The heartbeat extends the leases of a batch every Lease/3: failed
// heartbeats are retried, and a row whose lease is found lost has its run
// cancelled with idem.ErrLeaseLost while the other rows go on.
func TestHeartbeat(t *testing.T) {
	t.Parallel()
	b := &inboxtest.Memory{Rows: []inbox.Row{hookRow(1, "slow", 0), hookRow(2, "slow", 0)}, ExtendErrs: 2, Dropped: map[int64]bool{1: true}}
	var saw []string
	w, log := newHookWorker(t, b, &saw, 30*time.Millisecond)
	var causes []error
	if err := w.Handle("slow", func(ctx context.Context, _ struct{}, m inbox.Message) error {
		select {
		case <-ctx.Done():
			causes = append(causes, context.Cause(ctx))
			return ctx.Err()
		case <-time.After(150 * time.Millisecond): // several heartbeats
			return nil
		}
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(causes) != 1 || !errors.Is(causes[0], idem.ErrLeaseLost) {
		t.Fatalf("cancellation causes %v, want one lost lease", causes)
	}
	want := []string{"a end m1 lease_lost [a b]", "a end m2 processed [a b]"}
	var got []string
	for _, l := range *log {
		if strings.HasPrefix(l, "a end") {
			got = append(got, l)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("runs ended %q, want %q", got, want)
	}
	if b.Extends() < 4 {
		t.Errorf("%d heartbeats, want the failed ones retried", b.Extends())
	}
}
