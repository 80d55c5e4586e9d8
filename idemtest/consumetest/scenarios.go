package consumetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// runner plays the scenarios of one Run.
type runner struct {
	t      testing.TB
	target Target
	o      Options
	nonce  string
	report Report

	mu sync.Mutex
	// points is the most points a clean first delivery passed, and
	// durations how long clean first deliveries took.
	points    int
	durations []time.Duration
	// hung is set when a delivery did not finish in time: the scenarios
	// after it are skipped.
	hung atomic.Bool
}

// scenario is one scenario being played.
type scenario struct {
	r   *runner
	res *ScenarioResult

	mu       sync.Mutex
	ids      []string
	attempts map[string]int
	// want is the number of effects expected per id (1 unless set).
	want map[string]int
	// notes say what happened to an id, for its failure message.
	notes map[string][]string
	// clean says that first deliveries measure the handler.
	clean bool
}

func (r *runner) play(s Scenario, res *ScenarioResult) {
	sc := &scenario{r: r, res: res, attempts: map[string]int{}, want: map[string]int{}, notes: map[string][]string{}}
	switch s {
	case Once:
		sc.clean = true
		for _, id := range sc.newIDs(r.o.Messages) {
			sc.deliver(id, sc.body(id, 0), nil)
		}
	case Twice:
		sc.repeat(2)
	case Sequential:
		sc.repeat(r.o.Copies)
	case Concurrent:
		sc.concurrent()
	case OutOfOrder:
		ids := sc.newIDs(r.o.Messages)
		for _, id := range slices.Backward(ids) {
			sc.deliver(id, sc.body(id, 0), nil)
		}
		for _, id := range ids {
			sc.deliver(id, sc.body(id, 0), nil)
		}
		res.Note = "newest first, then oldest first"
	case Cancel:
		sc.faults(cancelFault)
	case Panic:
		if r.points == 0 {
			res.Skipped = "the handler calls no consumetest.Point (a panic is injected at one)"
			return
		}
		sc.faults(panicFault)
	case ChangedBody:
		sc.changedBody()
	case Kill:
		sc.kill()
	}
	if res.Skipped == "" {
		sc.check()
	}
}

// newIDs returns n fresh message ids of the scenario, in increasing order.
func (sc *scenario) newIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("ct-%s-%s-%03d", sc.r.nonce, sc.res.Scenario, len(sc.ids)+i+1)
	}
	sc.ids = append(sc.ids, ids...)
	sc.res.Messages = len(sc.ids)
	return ids
}

func (sc *scenario) body(id string, variant int) []byte { return sc.r.o.Body(id, variant) }

func (sc *scenario) note(id, format string, args ...any) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if n := fmt.Sprintf(format, args...); !slices.Contains(sc.notes[id], n) {
		sc.notes[id] = append(sc.notes[id], n)
	}
}

func (sc *scenario) fail(format string, args ...any) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.res.Failures = append(sc.res.Failures, fmt.Sprintf("%s: ", sc.res.Scenario)+fmt.Sprintf(format, args...))
}

// next counts one delivery of id and returns its Attempt.
func (sc *scenario) next(id string) int {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.attempts[id]++
	sc.res.Deliveries++
	return sc.attempts[id]
}

func (sc *scenario) failed() {
	sc.mu.Lock()
	sc.res.Failed++
	sc.mu.Unlock()
}

// repeat delivers every message n times in a row.
func (sc *scenario) repeat(n int) {
	for _, id := range sc.newIDs(sc.r.o.Messages) {
		for range n {
			sc.deliver(id, sc.body(id, 0), nil)
		}
		if !sc.r.hung.Load() {
			sc.note(id, "delivered %d× in a row", n)
		}
	}
}

// concurrent delivers Copies copies of every message from one goroutine
// each, released together.
func (sc *scenario) concurrent() {
	ids := sc.newIDs(sc.r.o.Messages)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for _, id := range ids {
		sc.note(id, "%d copies delivered at once", sc.r.o.Copies)
		for range sc.r.o.Copies {
			wg.Go(func() {
				<-start
				sc.deliver(id, sc.body(id, 0), nil)
			})
		}
	}
	close(start)
	wg.Wait()
	sc.res.Note = fmt.Sprintf("%d goroutines", len(ids)*sc.r.o.Copies)
}

// deliver delivers id until Deliver returns nil, as a broker redelivers an
// unacknowledged message, first with the fault of first (nil: none). It
// reports whether the message was finally acknowledged.
func (sc *scenario) deliver(id string, body []byte, first *injector) bool {
	if sc.r.hung.Load() {
		sc.note(id, "not delivered: an earlier delivery did not finish in time")
		return false
	}
	pause := 5 * time.Millisecond
	var last error
	for i := range sc.r.o.MaxAttempts {
		in := &injector{}
		if i == 0 && first != nil {
			in = first
		}
		err := sc.deliverOnce(id, body, in)
		if err == nil {
			return true
		}
		if errors.Is(err, errHung) {
			return false
		}
		if errors.Is(err, ErrDeadLettered) {
			sc.note(id, "%v", err)
			return false
		}
		last = err
		time.Sleep(pause/2 + rand.N(pause/2+1))
		pause = min(2*pause, 250*time.Millisecond)
	}
	sc.fail("id %q: still failing after %s: %v", id, plural(sc.r.o.MaxAttempts, "delivery"), last)
	return false
}

// errHung ends the redeliveries of a message whose delivery did not
// finish within Options.Timeout.
var errHung = errors.New("consumetest: the delivery did not finish in time")

// deliverOnce calls Target.Deliver once, with in's fault, on a goroutine
// of its own: a panic is recovered there, and a delivery still running
// at twice Options.Timeout is abandoned (errHung).
func (sc *scenario) deliverOnce(id string, body []byte, in *injector) error {
	timeout := sc.r.o.Timeout
	ctx, cancelTimeout := context.WithTimeout(context.Background(), timeout)
	defer cancelTimeout()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	in.cancel = cancel
	ctx = context.WithValue(ctx, injectorKey{}, in)
	d := Delivery{ID: id, Body: body, Attempt: sc.next(id)}
	if in.kind == cancelFault && in.at == 0 {
		t := time.AfterFunc(in.after, in.timed)
		defer t.Stop()
	}
	type result struct {
		err      error
		panicked any
		took     time.Duration
	}
	done := make(chan result, 1)
	go func() {
		var res result
		start := time.Now()
		defer func() {
			res.panicked, res.took = recover(), time.Since(start)
			done <- res
		}()
		res.err = sc.r.target.Deliver(ctx, d)
	}()
	abandon := time.NewTimer(2 * timeout)
	defer abandon.Stop()
	var res result
	select {
	case res = <-done:
	case <-abandon.C:
		res.err, res.took = errHung, 2*timeout
	}
	if errors.Is(res.err, errHung) || (res.err != nil && errors.Is(context.Cause(ctx), context.DeadlineExceeded)) {
		sc.failed()
		sc.r.hung.Store(true)
		sc.fail("id %q: delivery %d did not finish within %v (Options.Timeout; it returned %v): the handler is blocked, or slower than the timeout; the remaining scenarios are skipped",
			id, d.Attempt, timeout, res.err)
		return errHung
	}
	if res.panicked != nil {
		if _, ok := res.panicked.(injectedPanic); !ok {
			sc.fail("id %q: the handler panicked on delivery %d: %v", id, d.Attempt, res.panicked)
		}
		res.err = fmt.Errorf("consumetest: panic: %v", res.panicked)
	}
	if res.err != nil {
		sc.failed()
		return res.err
	}
	if n, _ := in.passed(); sc.clean && d.Attempt == 1 && in.kind == noFault {
		sc.r.measured(n, res.took)
	}
	return nil
}

// measured records a clean first delivery: points passed, duration.
func (r *runner) measured(points int, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.points = max(r.points, points)
	r.durations = append(r.durations, d)
}

// handlerDuration is the median duration of the clean first deliveries,
// at least a millisecond.
func (r *runner) handlerDuration() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.durations) == 0 {
		return time.Millisecond
	}
	ds := slices.Clone(r.durations)
	slices.Sort(ds)
	return max(ds[len(ds)/2], time.Millisecond)
}

// delays returns n delays spread from 0 to twice the handler's duration.
func (r *runner) delays(n int) []time.Duration {
	span := 2 * r.handlerDuration()
	ds := make([]time.Duration, n)
	for i := range ds {
		if n > 1 {
			ds[i] = span * time.Duration(i) / time.Duration(n-1)
		}
	}
	return ds
}

// faults interrupts one message at each point, or at timed delays when
// the handler has no points, then redelivers it until it succeeds.
func (sc *scenario) faults(kind fault) {
	r := sc.r
	if r.points > 0 {
		for i, id := range sc.newIDs(r.points) {
			in := &injector{kind: kind, at: i + 1}
			sc.deliver(id, sc.body(id, 0), in)
			if _, fired := in.passed(); !fired {
				sc.note(id, "point %d of %d not reached", i+1, r.points)
				continue
			}
			sc.note(id, "%s at point %d of %d, then redelivered", kind, i+1, r.points)
		}
		sc.res.Note = fmt.Sprintf("%s at each of %s", kind, plural(r.points, "point"))
		return
	}
	delays := r.delays(r.o.TimedFaults)
	landed := 0
	for i, id := range sc.newIDs(len(delays)) {
		in := &injector{kind: kind, after: delays[i]}
		before := sc.res.Failed
		sc.deliver(id, sc.body(id, 0), in)
		if sc.res.Failed > before {
			landed++
		}
		sc.note(id, "%s after %v, then redelivered", kind, delays[i])
	}
	sc.res.Note = fmt.Sprintf("%s after 0–%v (no Point): %d of %d failed the delivery", kind, delays[len(delays)-1], landed, len(delays))
}

// changedBody delivers each message, then the same id with a different
// body once, then the original again.
func (sc *scenario) changedBody() {
	ctx := context.Background()
	for _, id := range sc.newIDs(sc.r.o.Messages) {
		if !sc.deliver(id, sc.body(id, 0), nil) {
			continue
		}
		before, err := sc.effects(ctx, id)
		if err != nil {
			continue
		}
		in := &injector{}
		derr := sc.deliverOnce(id, sc.body(id, 1), in)
		after, err := sc.effects(ctx, id)
		if err != nil {
			continue
		}
		var v Verdict
		switch {
		case after == before+1:
			v = Applied
		case after == before && derr != nil:
			v = Rejected
		case after == before:
			v = Ignored
		default:
			sc.fail("id %q: the changed body took %d effects to %d", id, before, after)
			continue
		}
		sc.res.Verdict |= v
		if v == Applied {
			sc.mu.Lock()
			sc.want[id] = 2
			sc.mu.Unlock()
		}
		sc.note(id, "the changed body was %s", v)
		if v&sc.r.o.ChangedBody == 0 {
			detail := ""
			if derr != nil {
				detail = fmt.Sprintf(" (Deliver returned: %v)", derr)
			}
			sc.fail("id %q: a different body under a processed id was %s%s; expected %s (Options.ChangedBody)", id, v, detail, sc.r.o.ChangedBody)
		}
		sc.deliver(id, sc.body(id, 0), nil)
	}
	sc.res.Note = "expected " + sc.r.o.ChangedBody.String()
}

// effects calls Target.Effects with a timeout; an error is a failure.
func (sc *scenario) effects(ctx context.Context, id string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, sc.r.o.Timeout)
	defer cancel()
	n, err := sc.r.target.Effects(ctx, id)
	if err != nil {
		sc.fail("id %q: Effects: %v", id, err)
		return 0, err
	}
	if n < 0 {
		err = errors.New("negative count")
		sc.fail("id %q: Effects returned %d", id, n)
	}
	return n, err
}

// check compares every id's effects with the expected count.
func (sc *scenario) check() {
	ctx := context.Background()
	for _, id := range sc.ids {
		got, err := sc.effects(ctx, id)
		if err != nil {
			continue
		}
		want := 1
		if w, ok := sc.want[id]; ok {
			want = w
		}
		sc.res.Effects += got
		var what string
		switch {
		case got < want:
			sc.res.Lost++
			what = "lost"
		case got > want:
			sc.res.Duplicated++
			what = "duplicated"
		default:
			continue
		}
		detail := fmt.Sprintf("delivered %d×", sc.attempts[id])
		if notes := sc.notes[id]; len(notes) > 0 {
			detail = strings.Join(notes, "; ") + "; " + detail
		}
		sc.fail("id %q: expected %s, got %d: %s (%s)", id, plural(want, "effect"), got, what, detail)
	}
}
