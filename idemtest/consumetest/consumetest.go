package consumetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"
)

// Delivery is one delivery of a message to the target, as a broker would
// hand it over: the producer's message id, the payload and how many times
// this message has been delivered in the scenario so far.
type Delivery struct {
	// ID is the producer-assigned message id, unique to the run (printable
	// ASCII, at most 100 bytes): the dedupe key.
	ID string
	// Body is the payload, [Options].Body's for this id.
	Body []byte
	// Attempt is 1 for a message's first delivery in a scenario and grows
	// by one with every further delivery of the same id: a duplicate, a
	// redelivery after an error, a panic, a cancellation or a crash.
	Attempt int
}

// Target is the consumer under test.
type Target struct {
	// Deliver hands d to the user's handler, through whatever makes it
	// idempotent (an idem.Processor's Process, consume.GuardProcess, ...),
	// and returns when the handler is done. A nil error acknowledges the
	// delivery; an error makes the kit deliver it again later, as a broker
	// redelivers an unacknowledged message, unless it wraps
	// [ErrDeadLettered]. It is called from many goroutines at once. [Engine]
	// returns one for a consume.Engine. Required.
	Deliver func(ctx context.Context, d Delivery) error
	// Effects reports how many times the message id took effect: rows
	// written, credits applied, emails recorded as sent. It must read
	// durable state that a restarted process sees too. Required.
	Effects func(ctx context.Context, id string) (int, error)
	// Subprocess says that the test calling [Run] builds the same target
	// when it runs again in a child process: the kill scenario then starts
	// the test binary again with only this test selected, delivers
	// messages to the child's target, SIGKILLs it (at a [Point] or after a
	// delay) and redelivers to a new child. Everything the child must
	// share with the parent (a database file, a schema name) has to come
	// from [Dir] or a fixed name, not from a fresh random value. Without
	// Subprocess the kill scenario is skipped.
	Subprocess bool
}

// Scenario names one way of delivering messages.
type Scenario string

// The scenarios, in the order [Run] plays them.
const (
	// Once delivers every message once.
	Once Scenario = "once"
	// Twice delivers every message twice, one after the other.
	Twice Scenario = "twice"
	// Sequential delivers every message Options.Copies times, one after
	// the other.
	Sequential Scenario = "sequential"
	// Concurrent delivers Options.Copies copies of every message at the
	// same moment, one goroutine each (Messages × Copies goroutines).
	Concurrent Scenario = "concurrent"
	// OutOfOrder delivers the messages newest first, then all again oldest
	// first: a dedupe that remembers only the highest id seen loses them.
	OutOfOrder Scenario = "out-of-order"
	// Cancel cancels the delivery's context in the middle of the handler
	// (at each [Point], or after delays spread over the handler's measured
	// duration when it has none) and redelivers.
	Cancel Scenario = "cancel"
	// Panic panics inside the handler at each [Point], recovers, and
	// redelivers. Skipped when the handler has no Point.
	Panic Scenario = "panic"
	// ChangedBody delivers a message, then the same id with a different
	// body, then the original again; the second delivery's verdict must be
	// one of Options.ChangedBody.
	ChangedBody Scenario = "changed-body"
	// Kill runs the target in a child process (Target.Subprocess), kills
	// it with SIGKILL in the middle of the handler (at each [Point], or
	// after delays spread over the handler's duration) and once right
	// after the handler returned but before the delivery was
	// acknowledged, then redelivers to a restarted child.
	Kill Scenario = "kill"
)

// Scenarios lists every scenario in the order [Run] plays them.
func Scenarios() []Scenario {
	return []Scenario{Once, Twice, Sequential, Concurrent, OutOfOrder, Cancel, Panic, ChangedBody, Kill}
}

// Verdict is what the target did with a different body under an id it had
// already processed. Verdicts combine with | in [Options].ChangedBody.
type Verdict uint8

const (
	// Rejected: Deliver returned an error and nothing took effect (idem
	// reports a fingerprint mismatch; a consumer dead-letters it).
	Rejected Verdict = 1 << iota
	// Ignored: Deliver returned nil and nothing took effect (treated as a
	// duplicate).
	Ignored
	// Applied: the changed body took effect a second time (the id is not
	// the dedupe key, or the body is part of it).
	Applied
)

func (v Verdict) String() string {
	var names []string
	for _, x := range []struct {
		v    Verdict
		name string
	}{{Rejected, "rejected"}, {Ignored, "ignored"}, {Applied, "applied"}} {
		if v&x.v != 0 {
			names = append(names, x.name)
		}
	}
	if len(names) == 0 {
		return "none"
	}
	s := names[0]
	for _, n := range names[1:] {
		s += " or " + n
	}
	return s
}

// Options tune [Run]. A nil *Options, and every zero field, mean the
// defaults documented on each field.
type Options struct {
	// Messages is how many distinct messages each scenario delivers
	// (1-100). Default 4.
	Messages int
	// Copies is how many times Sequential and Concurrent deliver each
	// message (2-100). Default 10, so Concurrent starts 40 goroutines.
	Copies int
	// Skip lists scenarios not to play; they are reported as skipped.
	Skip []Scenario
	// ChangedBody lists the verdicts accepted for a different body under a
	// processed id. Zero means Rejected, what idem's consumers do.
	ChangedBody Verdict
	// Body returns the payload of message id; variant is 0, and 1 for the
	// changed body. It must return different bodies for different
	// variants. Nil means {"id":"<id>","variant":<variant>}.
	Body func(id string, variant int) []byte
	// MaxAttempts bounds the deliveries of one message that keep failing
	// (1-1000); after that the message is reported as failing. Default 20;
	// the pause between them grows from 5 ms to 250 ms.
	MaxAttempts int
	// Timeout bounds one delivery (its context's deadline), one Effects
	// call and a child process's start. A delivery that fails after its
	// deadline, or is still running at twice the timeout (it is then
	// abandoned), fails the scenario and skips the scenarios after it.
	// Default 30s.
	Timeout time.Duration
	// TimedFaults is how many cancellations (and, in a subprocess, kills)
	// land at delays spread over the handler's measured duration when the
	// handler calls no [Point] (1-50). Default 4.
	TimedFaults int
}

const (
	maxMessages    = 100
	maxCopies      = 100
	maxAttempts    = 1000
	maxTimedFaults = 50
)

func (o *Options) withDefaults() (Options, error) {
	var c Options
	if o != nil {
		c = *o
		c.Skip = slices.Clone(o.Skip)
	}
	def := func(v *int, d, maxV int, name string) error {
		if *v == 0 {
			*v = d
		}
		if *v < 1 || *v > maxV {
			return fmt.Errorf("consumetest: Options.%s must be between 1 and %d, got %d", name, maxV, *v)
		}
		return nil
	}
	if err := def(&c.Messages, 4, maxMessages, "Messages"); err != nil {
		return c, err
	}
	if c.Copies == 0 {
		c.Copies = 10
	}
	if c.Copies < 2 || c.Copies > maxCopies {
		return c, fmt.Errorf("consumetest: Options.Copies must be between 2 and %d, got %d", maxCopies, c.Copies)
	}
	if err := def(&c.MaxAttempts, 20, maxAttempts, "MaxAttempts"); err != nil {
		return c, err
	}
	if err := def(&c.TimedFaults, 4, maxTimedFaults, "TimedFaults"); err != nil {
		return c, err
	}
	if c.Timeout < 0 {
		return c, fmt.Errorf("consumetest: Options.Timeout must not be negative, got %v", c.Timeout)
	}
	if c.Timeout == 0 {
		c.Timeout = 30 * time.Second
	}
	if c.ChangedBody == 0 {
		c.ChangedBody = Rejected
	}
	if c.ChangedBody&^(Rejected|Ignored|Applied) != 0 {
		return c, fmt.Errorf("consumetest: Options.ChangedBody has unknown verdict bits %#x", uint8(c.ChangedBody))
	}
	for _, s := range c.Skip {
		if !slices.Contains(Scenarios(), s) {
			return c, fmt.Errorf("consumetest: Options.Skip: unknown scenario %q (known: %v)", s, Scenarios())
		}
	}
	if c.Body == nil {
		c.Body = defaultBody
	}
	return c, nil
}

func defaultBody(id string, variant int) []byte {
	b, _ := json.Marshal(struct {
		ID      string `json:"id"`
		Variant int    `json:"variant"`
	}{id, variant})
	return b
}

// Run plays every scenario against target and fails t, through t.Errorf,
// for every message that did not take effect exactly once (or, in
// ChangedBody, whose verdict was not accepted), naming the scenario, the
// id, the expected and the observed number of effects. It logs the table
// of [Report] with t.Log and returns the report. opts may be nil.
//
// Every scenario uses fresh message ids, unique to the run, so a target
// over a database that outlives the test needs no cleanup between runs.
//
// When target.Subprocess is set, Run also serves as the child process of
// the kill scenario: in a process started by Run it delivers what its
// parent sends to target.Deliver and then skips the test (t.SkipNow), so
// the code after Run does not run in the child.
func Run(t testing.TB, target Target, opts *Options) Report {
	t.Helper()
	if target.Deliver == nil || target.Effects == nil {
		t.Fatalf("consumetest: Target.Deliver and Target.Effects are required")
		return Report{}
	}
	o, err := opts.withDefaults()
	if err != nil {
		t.Fatalf("%v", err)
		return Report{}
	}
	if name := os.Getenv(envChild); name != "" {
		if name != t.Name() {
			t.Skipf("consumetest: this process serves %s only", name)
			return Report{}
		}
		serveChild(t, target, o)
		t.SkipNow()
		return Report{}
	}
	r := &runner{t: t, target: target, o: o, nonce: nonce()}
	for _, s := range Scenarios() {
		res := ScenarioResult{Scenario: s}
		switch {
		case slices.Contains(o.Skip, s):
			res.Skipped = "skipped by Options.Skip"
		case r.hung.Load():
			res.Skipped = "an earlier delivery did not finish in time"
		default:
			r.play(s, &res)
		}
		for _, f := range res.Failures {
			t.Errorf("consumetest: %s", f)
		}
		r.report.Scenarios = append(r.report.Scenarios, res)
	}
	r.report.Points = r.points
	t.Log("consumetest:\n" + r.report.String())
	return r.report
}

// nonce returns 8 random hex digits that keep one run's ids apart from
// every other's.
func nonce() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// dirs holds the directories [Dir] handed out, by test name.
var dirs sync.Map

// Dir returns a directory that the test and the child processes of its
// kill scenario share: a t.TempDir() in the test, the same path in the
// child, so that a target opens the same database file in both. Repeated
// calls in one test return the same directory.
func Dir(t testing.TB) string {
	t.Helper()
	if d := os.Getenv(envDir); d != "" && os.Getenv(envChild) == t.Name() {
		return d
	}
	if d, ok := dirs.Load(t.Name()); ok {
		return d.(string)
	}
	d := t.TempDir()
	dirs.Store(t.Name(), d)
	t.Cleanup(func() { dirs.Delete(t.Name()) })
	return d
}
