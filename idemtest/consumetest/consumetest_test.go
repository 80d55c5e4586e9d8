package consumetest_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/idemtest/consumetest"
	"github.com/idem-go/idem/retry"
)

// recorder is a testing.TB that records failures instead of failing, so a
// test can assert that the kit fails a broken consumer, and how.
type recorder struct {
	testing.TB
	mu     sync.Mutex
	errors []string
	logs   []string
}

// fatal is what recorder's Fatal* panic with.
type fatal struct{ msg string }

func (r *recorder) add(msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errors = append(r.errors, msg)
}

func (r *recorder) Errorf(format string, args ...any) { r.add(fmt.Sprintf(format, args...)) }
func (r *recorder) Error(args ...any)                 { r.add(fmt.Sprint(args...)) }
func (r *recorder) Fail()                             { r.add("Fail") }
func (r *recorder) FailNow()                          { r.add("FailNow"); panic(fatal{"FailNow"}) }
func (r *recorder) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	r.add(msg)
	panic(fatal{msg})
}
func (r *recorder) Fatal(args ...any) { r.Fatalf("%s", fmt.Sprint(args...)) }
func (r *recorder) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.errors) > 0
}
func (r *recorder) Logf(format string, args ...any) {
	r.mu.Lock()
	r.logs = append(r.logs, fmt.Sprintf(format, args...))
	r.mu.Unlock()
	r.TB.Logf(format, args...)
}
func (r *recorder) Log(args ...any) { r.Logf("%s", fmt.Sprint(args...)) }

// failedScenarios returns the scenarios named by the recorded failures.
func (r *recorder) failedScenarios() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var names []string
	for _, e := range r.errors {
		name, _, _ := strings.Cut(strings.TrimPrefix(e, "consumetest: "), ":")
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	return names
}

// wantFailures checks that exactly the scenarios want failed and that
// each failure message contains one of the texts.
func wantFailures(t *testing.T, r *recorder, rep consumetest.Report, want []string, texts ...string) {
	t.Helper()
	got := r.failedScenarios()
	slices.Sort(got)
	want = slices.Sorted(slices.Values(want))
	if !slices.Equal(got, want) {
		t.Errorf("failed scenarios %q, want %q; failures:\n%s", got, want, strings.Join(r.errors, "\n"))
	}
	for _, e := range r.errors {
		if !slices.ContainsFunc(texts, func(s string) bool { return strings.Contains(e, s) }) {
			t.Errorf("failure %q contains none of %q", e, texts)
		}
	}
	for _, s := range rep.Scenarios {
		if (len(s.Failures) > 0) != slices.Contains(want, string(s.Scenario)) {
			t.Errorf("report row %s: %d failures", s.Scenario, len(s.Failures))
		}
	}
	if rep.Failed() != (len(want) > 0) {
		t.Errorf("Report.Failed() = %v", rep.Failed())
	}
}

// ledger counts effects in memory; apply fails, like a database call,
// when its context is done.
type ledger struct {
	mu sync.Mutex
	n  map[string]int
}

func newLedger() *ledger { return &ledger{n: map[string]int{}} }

func (l *ledger) apply(ctx context.Context, id string) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n[id]++
	return nil
}

func (l *ledger) effects(_ context.Context, id string) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n[id], nil
}

// guarded is a correct consumer: an idem.Guard runs the effect once per id.
func guarded(l *ledger, points bool) consumetest.Target {
	g := idem.NewGuard(idemtest.NewMemoryStore(nil), nil)
	return consumetest.Target{
		Deliver: func(ctx context.Context, d consumetest.Delivery) error {
			call := idem.Call{Scope: "payments", Key: d.ID, Fingerprint: idem.FingerprintBytes(d.Body)}
			_, err := g.Do(ctx, call, func(ctx context.Context, run idem.Run) ([]byte, error) {
				if points {
					consumetest.Point(ctx)
				}
				return nil, l.apply(ctx, d.ID)
			})
			return err
		},
		Effects: l.effects,
	}
}

func TestGuardedConsumerPasses(t *testing.T) {
	t.Parallel()
	r := &recorder{TB: t}
	rep := consumetest.Run(r, guarded(newLedger(), true), nil)
	wantFailures(t, r, rep, nil)
	if rep.Points != 1 {
		t.Errorf("Points = %d, want 1", rep.Points)
	}
	for _, s := range rep.Scenarios {
		switch {
		case s.Scenario == consumetest.Kill:
			if s.Skipped == "" {
				t.Errorf("kill played without Subprocess")
			}
		case s.Skipped != "":
			t.Errorf("%s skipped: %s", s.Scenario, s.Skipped)
		case s.Effects != s.Messages || s.Lost != 0 || s.Duplicated != 0:
			t.Errorf("%s: %+v", s.Scenario, s)
		}
	}
	if s, _ := rep.Scenario(consumetest.Concurrent); s.Deliveries < 40 {
		t.Errorf("concurrent: %d deliveries, want at least 40", s.Deliveries)
	}
	if s, _ := rep.Scenario(consumetest.ChangedBody); s.Verdict != consumetest.Rejected {
		t.Errorf("changed body: verdict %v, want rejected", s.Verdict)
	}
	if s, _ := rep.Scenario(consumetest.Panic); s.Failed != 1 {
		t.Errorf("panic: %d failed deliveries, want 1 (the injected panic)", s.Failed)
	}
	table := strings.Join(r.logs, "\n")
	for _, want := range []string{"9 scenarios: 8 passed, 0 failed, 1 skipped", "changed-body", "rejected", "Target.Subprocess is not set"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
}

// A handler without points gets timed cancellations and no panic.
func TestGuardedConsumerWithoutPoints(t *testing.T) {
	t.Parallel()
	r := &recorder{TB: t}
	rep := consumetest.Run(r, guarded(newLedger(), false), &consumetest.Options{Messages: 2, Copies: 3, TimedFaults: 3})
	wantFailures(t, r, rep, nil)
	if rep.Points != 0 {
		t.Errorf("Points = %d", rep.Points)
	}
	if s, _ := rep.Scenario(consumetest.Panic); !strings.Contains(s.Skipped, "Point") {
		t.Errorf("panic: skipped %q", s.Skipped)
	}
	if s, _ := rep.Scenario(consumetest.Cancel); s.Messages != 3 || !strings.Contains(s.Note, "no Point") {
		t.Errorf("cancel: %+v", s)
	}
}

// The naive consumer applies every delivery.
func TestCatchesNaive(t *testing.T) {
	t.Parallel()
	l := newLedger()
	r := &recorder{TB: t}
	rep := consumetest.Run(r, consumetest.Target{
		Deliver: func(ctx context.Context, d consumetest.Delivery) error {
			consumetest.Point(ctx)
			return l.apply(ctx, d.ID)
		},
		Effects: l.effects,
	}, nil)
	wantFailures(t, r, rep, []string{"twice", "sequential", "concurrent", "out-of-order", "changed-body"},
		"expected 1 effect, got 2: duplicated (delivered 2× in a row; delivered 2×)",
		"expected 1 effect, got 10: duplicated",
		"expected 1 effect, got 2: duplicated (delivered 2×)",
		"was applied; expected rejected (Options.ChangedBody)",
		"expected 2 effects, got 3: duplicated")
	if s, _ := rep.Scenario(consumetest.Twice); s.Duplicated != 4 || s.Effects != 8 {
		t.Errorf("twice: %+v", s)
	}
}

// The mark-before-run consumer commits its dedupe mark before the effect:
// an interruption in between loses the message.
func TestCatchesMarkBeforeRun(t *testing.T) {
	t.Parallel()
	l := newLedger()
	var (
		mu     sync.Mutex
		marked = map[string]bool{}
	)
	r := &recorder{TB: t}
	rep := consumetest.Run(r, consumetest.Target{
		Deliver: func(ctx context.Context, d consumetest.Delivery) error {
			mu.Lock()
			seen := marked[d.ID]
			marked[d.ID] = true
			mu.Unlock()
			if seen {
				return nil
			}
			consumetest.Point(ctx)
			return l.apply(ctx, d.ID)
		},
		Effects: l.effects,
	}, &consumetest.Options{ChangedBody: consumetest.Ignored})
	wantFailures(t, r, rep, []string{"cancel", "panic"},
		`expected 1 effect, got 0: lost (cancelled at point 1 of 1, then redelivered; delivered 2×)`,
		`expected 1 effect, got 0: lost (panicked at point 1 of 1, then redelivered; delivered 2×)`)
	if s, _ := rep.Scenario(consumetest.Cancel); s.Lost != 1 {
		t.Errorf("cancel: %+v", s)
	}
}

// A dedupe that remembers only the highest id seen drops older messages
// delivered late.
func TestCatchesHighWaterMark(t *testing.T) {
	t.Parallel()
	l := newLedger()
	var (
		mu      sync.Mutex
		highest = map[string]string{} // by scenario
	)
	r := &recorder{TB: t}
	rep := consumetest.Run(r, consumetest.Target{
		Deliver: func(ctx context.Context, d consumetest.Delivery) error {
			mu.Lock()
			defer mu.Unlock()
			scenario := d.ID[:len(d.ID)-3] // ct-NONCE-SCENARIO-NNN
			if d.ID <= highest[scenario] {
				return nil
			}
			if err := l.apply(ctx, d.ID); err != nil {
				return err
			}
			highest[scenario] = d.ID
			return nil
		},
		Effects: l.effects,
		// Concurrent catches it too, unless the goroutines happen to run
		// in order.
	}, &consumetest.Options{ChangedBody: consumetest.Ignored, Skip: []consumetest.Scenario{consumetest.Concurrent}})
	wantFailures(t, r, rep, []string{"out-of-order"}, "expected 1 effect, got 0: lost")
	if s, _ := rep.Scenario(consumetest.OutOfOrder); s.Lost != 3 {
		t.Errorf("out-of-order: %+v", s)
	}
}

// ChangedBody says which verdicts pass.
func TestChangedBodyExpectation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		expect consumetest.Verdict
		fails  bool
	}{
		{"default", 0, true},
		{"ignored", consumetest.Ignored, false},
		{"rejected-or-ignored", consumetest.Rejected | consumetest.Ignored, false},
		{"applied", consumetest.Applied, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// Deduped by id only: the changed body is ignored.
			l := newLedger()
			var mu sync.Mutex
			r := &recorder{TB: t}
			rep := consumetest.Run(r, consumetest.Target{
				Deliver: func(ctx context.Context, d consumetest.Delivery) error {
					mu.Lock()
					defer mu.Unlock()
					if n, _ := l.effects(ctx, d.ID); n > 0 {
						return nil
					}
					return l.apply(ctx, d.ID)
				},
				Effects: l.effects,
			}, &consumetest.Options{ChangedBody: tc.expect, Skip: []consumetest.Scenario{consumetest.Concurrent, consumetest.Sequential}})
			var want []string
			if tc.fails {
				want = []string{"changed-body"}
			}
			expect := tc.expect
			if expect == 0 {
				expect = consumetest.Rejected
			}
			wantFailures(t, r, rep, want, "a different body under a processed id was ignored; expected "+expect.String())
			if s, _ := rep.Scenario(consumetest.ChangedBody); s.Verdict != consumetest.Ignored {
				t.Errorf("verdict %v", s.Verdict)
			}
			if s, _ := rep.Scenario(consumetest.Concurrent); s.Skipped != "skipped by Options.Skip" {
				t.Errorf("concurrent: %+v", s)
			}
		})
	}
}

// Every misuse is a clear fatal error before anything is delivered.
func TestInvalidUse(t *testing.T) {
	t.Parallel()
	l := newLedger()
	ok := consumetest.Target{Deliver: func(context.Context, consumetest.Delivery) error { return nil }, Effects: l.effects}
	for _, tc := range []struct {
		target consumetest.Target
		opts   *consumetest.Options
		want   string
	}{
		{consumetest.Target{Effects: l.effects}, nil, "Target.Deliver and Target.Effects are required"},
		{consumetest.Target{Deliver: ok.Deliver}, nil, "Target.Deliver and Target.Effects are required"},
		{ok, &consumetest.Options{Messages: 101}, "Options.Messages must be between 1 and 100, got 101"},
		{ok, &consumetest.Options{Messages: -1}, "Options.Messages must be between 1 and 100, got -1"},
		{ok, &consumetest.Options{Copies: 1}, "Options.Copies must be between 2 and 100, got 1"},
		{ok, &consumetest.Options{MaxAttempts: 1001}, "Options.MaxAttempts must be between 1 and 1000, got 1001"},
		{ok, &consumetest.Options{TimedFaults: 51}, "Options.TimedFaults must be between 1 and 50, got 51"},
		{ok, &consumetest.Options{Timeout: -1}, "Options.Timeout must not be negative"},
		{ok, &consumetest.Options{ChangedBody: 8}, "Options.ChangedBody has unknown verdict bits 0x8"},
		{ok, &consumetest.Options{Skip: []consumetest.Scenario{"twice", "thrice"}}, `Options.Skip: unknown scenario "thrice"`},
	} {
		r := &recorder{TB: t}
		func() {
			defer func() {
				if _, ok := recover().(fatal); !ok {
					t.Errorf("%s: Run did not stop with Fatal", tc.want)
				}
			}()
			consumetest.Run(r, tc.target, tc.opts)
		}()
		if len(r.errors) != 1 || !strings.Contains(r.errors[0], tc.want) {
			t.Errorf("errors %q, want one containing %q", r.errors, tc.want)
		}
	}
}

// Failing handlers, panics the kit did not inject and failing Effects are
// reported with what happened.
func TestErrorsReported(t *testing.T) {
	t.Parallel()
	only := func(s consumetest.Scenario) []consumetest.Scenario {
		return slices.DeleteFunc(consumetest.Scenarios(), func(x consumetest.Scenario) bool { return x == s })
	}
	l := newLedger()
	t.Run("always-failing", func(t *testing.T) {
		r := &recorder{TB: t}
		rep := consumetest.Run(r, consumetest.Target{
			Deliver: func(context.Context, consumetest.Delivery) error { return errors.New("database is down") },
			Effects: l.effects,
		}, &consumetest.Options{Messages: 1, MaxAttempts: 2, Skip: only(consumetest.Once)})
		wantFailures(t, r, rep, []string{"once"}, "still failing after 2 deliveries: database is down", "expected 1 effect, got 0: lost (delivered 2×)")
	})
	t.Run("panicking", func(t *testing.T) {
		r := &recorder{TB: t}
		var n int
		rep := consumetest.Run(r, consumetest.Target{
			Deliver: func(ctx context.Context, d consumetest.Delivery) error {
				if n++; n == 1 {
					panic("nil map")
				}
				return l.apply(ctx, d.ID)
			},
			Effects: l.effects,
		}, &consumetest.Options{Messages: 1, Skip: only(consumetest.Once)})
		wantFailures(t, r, rep, []string{"once"}, `the handler panicked on delivery 1: nil map`)
	})
	t.Run("effects-failing", func(t *testing.T) {
		r := &recorder{TB: t}
		rep := consumetest.Run(r, consumetest.Target{
			Deliver: func(context.Context, consumetest.Delivery) error { return nil },
			Effects: func(context.Context, string) (int, error) { return 0, errors.New("no such table") },
		}, &consumetest.Options{Messages: 1, Skip: only(consumetest.Once)})
		wantFailures(t, r, rep, []string{"once"}, "Effects: no such table")
	})
}

var quiet = slog.New(slog.DiscardHandler)

// fileLedger keeps effects as lines in a file under consumetest.Dir, so a
// restarted process sees them: one line per effect.
type fileLedger struct {
	path string
	mu   sync.Mutex
}

func newFileLedger(t testing.TB) *fileLedger {
	return &fileLedger{path: filepath.Join(consumetest.Dir(t), "effects.log")}
}

// count returns how many lines say id.
func (f *fileLedger) count(id string) (int, error) {
	fh, err := os.Open(f.path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer fh.Close()
	n := 0
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		if sc.Text() == id {
			n++
		}
	}
	return n, sc.Err()
}

// append writes id's line and syncs it: the effect (and, for the durable
// consumer, its dedupe record at once).
func (f *fileLedger) append(ctx context.Context, id string) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	fh, err := os.OpenFile(f.path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := fh.WriteString(id + "\n"); err != nil {
		fh.Close()
		return err
	}
	if err := fh.Sync(); err != nil {
		fh.Close()
		return err
	}
	return fh.Close()
}

func (f *fileLedger) effects(_ context.Context, id string) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.count(id)
}

// processOnly keeps the in-process scenarios short in the subprocess
// tests: the point there is the kill scenario.
var processOnly = &consumetest.Options{Messages: 2, Copies: 3, Skip: []consumetest.Scenario{consumetest.Sequential}}

// An in-memory dedupe passes every in-process scenario and duplicates the
// message that was processed, but not acknowledged, when its process was
// killed.
func TestCatchesForgetfulDedupe(t *testing.T) {
	t.Parallel()
	f := newFileLedger(t)
	seen := map[string]bool{} // forgotten on restart
	r := &recorder{TB: t}
	rep := consumetest.Run(r, consumetest.Target{
		Deliver: func(ctx context.Context, d consumetest.Delivery) error {
			f.mu.Lock()
			defer f.mu.Unlock()
			if seen[d.ID] {
				return nil
			}
			consumetest.Point(ctx)
			if err := f.append(ctx, d.ID); err != nil {
				return err
			}
			seen[d.ID] = true
			return nil
		},
		Effects:    f.effects,
		Subprocess: true,
	}, processOnly)
	wantFailures(t, r, rep, []string{"kill", "changed-body"},
		"expected 1 effect, got 2: duplicated (SIGKILL after the handler returned, before the ack (it landed after the handler returned), then redelivered to a restarted process; delivered 2×)",
		"was ignored; expected rejected")
	s, _ := rep.Scenario(consumetest.Kill)
	if s.Messages != 2 || s.Duplicated != 1 || s.Lost != 0 || !strings.Contains(s.Note, "2 SIGKILLs: 1 mid-handler, 1 after the handler returned") {
		t.Errorf("kill: %+v", s)
	}
}

// A consumer whose dedupe record is its effect, written at once and
// synced, survives every kill.
func TestDurableConsumerSurvivesKills(t *testing.T) {
	t.Parallel()
	f := newFileLedger(t)
	r := &recorder{TB: t}
	rep := consumetest.Run(r, consumetest.Target{
		Deliver: func(ctx context.Context, d consumetest.Delivery) error {
			f.mu.Lock()
			defer f.mu.Unlock()
			if n, err := f.count(d.ID); err != nil || n > 0 {
				return err
			}
			consumetest.Point(ctx)
			return f.append(ctx, d.ID)
		},
		Effects:    f.effects,
		Subprocess: true,
	}, &consumetest.Options{Messages: 2, Copies: 3, ChangedBody: consumetest.Ignored, Skip: []consumetest.Scenario{consumetest.Sequential}})
	wantFailures(t, r, rep, nil)
	if s, _ := rep.Scenario(consumetest.Kill); s.Skipped != "" || s.Messages != 2 || s.Effects != 2 {
		t.Errorf("kill: %+v", s)
	}
}

// A mark-before-run consumer whose mark is durable loses the message that
// was killed between the mark and the effect.
func TestCatchesMarkBeforeRunKilled(t *testing.T) {
	t.Parallel()
	f := newFileLedger(t)
	marks := &fileLedger{path: filepath.Join(consumetest.Dir(t), "marks.log")}
	r := &recorder{TB: t}
	rep := consumetest.Run(r, consumetest.Target{
		Deliver: func(ctx context.Context, d consumetest.Delivery) error {
			f.mu.Lock()
			defer f.mu.Unlock()
			if n, err := marks.count(d.ID); err != nil || n > 0 {
				return err
			}
			if err := marks.append(ctx, d.ID); err != nil {
				return err
			}
			consumetest.Point(ctx)
			return f.append(ctx, d.ID)
		},
		Effects:    f.effects,
		Subprocess: true,
	}, &consumetest.Options{Messages: 2, Copies: 3, ChangedBody: consumetest.Ignored, Skip: []consumetest.Scenario{consumetest.Sequential}})
	wantFailures(t, r, rep, []string{"cancel", "panic", "kill"},
		"expected 1 effect, got 0: lost (cancelled at point 1 of 1",
		"expected 1 effect, got 0: lost (panicked at point 1 of 1",
		"expected 1 effect, got 0: lost (SIGKILL at point 1, then redelivered to a restarted process; delivered 2×)")
	if s, _ := rep.Scenario(consumetest.Kill); s.Lost != 1 || s.Duplicated != 0 {
		t.Errorf("kill: %+v", s)
	}
}

// A delivery that does not finish in time fails its scenario once and
// skips the rest, whether the handler gives up at its context's deadline
// or ignores the context altogether.
func TestHungDelivery(t *testing.T) {
	t.Parallel()
	l := newLedger()
	for _, tc := range []struct {
		name  string
		block func(ctx context.Context) error
	}{
		{"deadline", func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }},
		{"ignores-context", func(ctx context.Context) error { <-t.Context().Done(); return nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := &recorder{TB: t}
			rep := consumetest.Run(r, consumetest.Target{
				Deliver: func(ctx context.Context, d consumetest.Delivery) error {
					if d.Attempt == 2 {
						return tc.block(ctx)
					}
					return l.apply(ctx, d.ID)
				},
				Effects: l.effects,
			}, &consumetest.Options{Timeout: 50 * time.Millisecond})
			wantFailures(t, r, rep, []string{"twice"}, `delivery 2 did not finish within 50ms (Options.Timeout; it returned `,
				"expected 1 effect, got 0: lost (not delivered: an earlier delivery did not finish in time; delivered 0×)")
			if s, _ := rep.Scenario(consumetest.Twice); len(s.Failures) != 4 || s.Lost != 3 {
				t.Errorf("twice: %+v", s)
			}
			for _, s := range rep.Scenarios[2:] {
				if s.Skipped != "an earlier delivery did not finish in time" {
					t.Errorf("%s: skipped %q", s.Scenario, s.Skipped)
				}
			}
		})
	}
}

// The consumer engine of idem's broker adapters, with GuardProcess,
// passes; a changed body is dead-lettered (rejected).
func TestEngineConsumerPasses(t *testing.T) {
	t.Parallel()
	l := newLedger()
	g := idem.NewGuard(idemtest.NewMemoryStore(nil), nil)
	e, err := consume.New(consume.GuardProcess(g, func(ctx context.Context, _ idem.Run, d consume.Delivery) error {
		consumetest.Point(ctx)
		return l.apply(ctx, d.ID())
	}), &consume.Config{Name: "payments", Logger: quiet, Retry: &retry.Policy{Base: time.Millisecond, Cap: 10 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{TB: t}
	rep := consumetest.Run(r, consumetest.Target{Deliver: consumetest.Engine(e), Effects: l.effects}, nil)
	wantFailures(t, r, rep, nil)
	if s, _ := rep.Scenario(consumetest.ChangedBody); s.Verdict != consumetest.Rejected {
		t.Errorf("changed body: %+v", s)
	}
}

// A message the engine dead-letters is not delivered again, and reported
// lost with the reason.
func TestEngineDeadLetterIsLost(t *testing.T) {
	t.Parallel()
	l := newLedger()
	e, err := consume.New(func(ctx context.Context, msg idem.Message, d consume.Delivery) (idem.Outcome, error) {
		return "", errors.New("card declined")
	}, &consume.Config{Name: "payments", Logger: quiet, Retry: &retry.Policy{MaxAttempts: 2, Base: time.Millisecond, Cap: time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{TB: t}
	only := slices.DeleteFunc(consumetest.Scenarios(), func(s consumetest.Scenario) bool { return s == consumetest.Once })
	rep := consumetest.Run(r, consumetest.Target{Deliver: consumetest.Engine(e), Effects: l.effects}, &consumetest.Options{Messages: 1, Skip: only})
	wantFailures(t, r, rep, []string{"once"},
		`expected 1 effect, got 0: lost (consumetest: dead-lettered (max_attempts): card declined; delivered 2×)`)
}

// A child process that cannot build its target fails the kill scenario
// with the child's own output.
func TestChildFailsToStart(t *testing.T) {
	t.Parallel()
	if d := consumetest.Dir(t); d != consumetest.Dir(t) {
		t.Fatalf("Dir changed between calls: %q", d)
	}
	if os.Getenv("IDEM_CONSUMETEST_CHILD") != "" { // the kit's child process
		t.Fatal("cannot open the ledger in the child")
	}
	l := newLedger()
	r := &recorder{TB: t}
	rep := consumetest.Run(r, consumetest.Target{
		Deliver: func(ctx context.Context, d consumetest.Delivery) error {
			consumetest.Point(ctx)
			return l.apply(ctx, d.ID)
		},
		Effects:    l.effects,
		Subprocess: true,
	}, &consumetest.Options{Messages: 1, Copies: 2, ChangedBody: consumetest.Applied,
		Skip: []consumetest.Scenario{consumetest.Twice, consumetest.Sequential, consumetest.Concurrent, consumetest.OutOfOrder, consumetest.ChangedBody}})
	wantFailures(t, r, rep, []string{"kill"}, "cannot start the target in a child process: the child process ended (exit status 1); its output:")
	if s, _ := rep.Scenario(consumetest.Kill); len(s.Failures) != 1 || s.Messages != 0 || !strings.Contains(s.Failures[0], "cannot open the ledger in the child") {
		t.Errorf("kill: %q", s.Failures)
	}
}
