package storekit_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/storekit"
)

// op is a test call: the store call's answer is n doubled, or an error for
// a negative n.
type op struct {
	storekit.Pending
	n, got int
	kind   string
}

// fakeStore records the store calls a Coalescer makes; the first hold of
// them wait until release.
type fakeStore struct {
	hold    int
	release chan struct{}

	mu      sync.Mutex
	calls   [][]int // the ns of each store call
	inside  int     // store calls in flight now
	maxSeen int
}

func newFake(hold int) *fakeStore { return &fakeStore{hold: hold, release: make(chan struct{})} }

func (f *fakeStore) exec(ctx context.Context, ops []*op) {
	f.mu.Lock()
	ns := make([]int, len(ops))
	for i, o := range ops {
		ns[i] = o.n
	}
	f.calls = append(f.calls, ns)
	held := len(f.calls) <= f.hold
	f.inside++
	f.maxSeen = max(f.maxSeen, f.inside)
	f.mu.Unlock()
	if held {
		<-f.release
	}
	for _, o := range ops {
		if o.n < 0 {
			o.Err = fmt.Errorf("refused %d", o.n)
			continue
		}
		o.got, o.Err = 2*o.n, nil
	}
	f.mu.Lock()
	f.inside--
	f.mu.Unlock()
}

func (f *fakeStore) storeCalls() [][]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([][]int(nil), f.calls...)
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestCoalescerLoneCall: a call that finds nothing in flight is one store
// call of its own, made from the caller's goroutine with its context.
func TestCoalescerLoneCall(t *testing.T) {
	t.Parallel()
	type key struct{}
	ctx := context.WithValue(context.Background(), key{}, "caller")
	var seen any
	c := &storekit.Coalescer[*op]{MaxBatch: 8, InFlight: 2, Exec: func(ctx context.Context, ops []*op) {
		seen = ctx.Value(key{})
		for _, o := range ops {
			o.got = 2 * o.n
		}
	}}
	o := &op{n: 21}
	if err := c.Do(ctx, o); err != nil || o.got != 42 || seen != "caller" {
		t.Fatalf("Do: %v, got %d, context value %v", err, o.got, seen)
	}
}

// TestCoalescerGroups: 100 calls behind two held store calls queue, then go
// out in groups of at most MaxBatch, never more than InFlight at once, and
// every caller gets its own answer, errors included.
func TestCoalescerGroups(t *testing.T) {
	t.Parallel()
	f := newFake(2)
	c := &storekit.Coalescer[*op]{MaxBatch: 16, InFlight: 2, Exec: f.exec}
	ctx := context.Background()
	const n = 100
	ops := make([]*op, n+2)
	errs := make([]error, n+2)
	var wg sync.WaitGroup
	for i := range ops {
		ops[i] = &op{n: i}
		if i%10 == 9 {
			ops[i].n = -i
		}
	}
	for i := range 2 {
		wg.Go(func() { errs[i] = c.Do(ctx, ops[i]) })
	}
	waitUntil(t, "two store calls in flight", func() bool { return len(f.storeCalls()) == 2 })
	for i := 2; i < n+2; i++ {
		wg.Go(func() { errs[i] = c.Do(ctx, ops[i]) })
	}
	waitUntil(t, "every other call queued", func() bool { return c.Queued() == n })
	close(f.release)
	wg.Wait()

	calls := f.storeCalls()
	sent := 0
	for i, call := range calls {
		if i < 2 && len(call) != 1 {
			t.Errorf("store call %d carried %d calls, want a lone call", i, len(call))
		}
		if len(call) > 16 {
			t.Errorf("store call %d carried %d calls, more than MaxBatch", i, len(call))
		}
		sent += len(call)
	}
	if sent != n+2 || len(calls) > 2+(n+15)/16+1 {
		t.Errorf("%d calls went out in %d store calls: %v", sent, len(calls), calls)
	}
	if f.maxSeen > 2 {
		t.Errorf("%d store calls in flight at once, InFlight is 2", f.maxSeen)
	}
	for i, o := range ops {
		switch {
		case o.n < 0 && (errs[i] == nil || errs[i].Error() != fmt.Sprintf("refused %d", o.n)):
			t.Errorf("call %d: %v, want its own refusal", i, errs[i])
		case o.n >= 0 && (errs[i] != nil || o.got != 2*o.n):
			t.Errorf("call %d: %v, got %d", i, errs[i], o.got)
		}
	}
}

// TestCoalescerFits: a call that does not fit the group's first waits for a
// later store call, keeping its place.
func TestCoalescerFits(t *testing.T) {
	t.Parallel()
	f := newFake(1)
	c := &storekit.Coalescer[*op]{MaxBatch: 64, InFlight: 1, Exec: f.exec,
		Fits: func(first, o *op) bool { return first.kind == o.kind }}
	ctx := context.Background()
	var wg sync.WaitGroup
	wg.Go(func() { _ = c.Do(ctx, &op{n: 0}) })
	waitUntil(t, "the lone call in flight", func() bool { return len(f.storeCalls()) == 1 })
	for i := 1; i <= 6; i++ {
		o := &op{n: i, kind: []string{"a", "b"}[i%2]}
		wg.Go(func() { _ = c.Do(ctx, o) })
		waitUntil(t, "the call queued", func() bool { return c.Queued() == i })
	}
	close(f.release)
	wg.Wait()
	calls := f.storeCalls()
	if len(calls) != 3 || fmt.Sprint(calls[1:]) != "[[1 3 5] [2 4 6]]" {
		t.Fatalf("store calls %v, want the lone call, then [1 3 5] and [2 4 6]", calls)
	}
}

// TestCoalescerCallerGivesUp: a queued call whose context ends returns its
// cause (wrapped) and is never sent; a sent one returns too, and the store
// call goes on for the others, on a context that did not end with the
// first caller's. A call that succeeded after its caller left is handed to
// Abandoned.
func TestCoalescerCallerGivesUp(t *testing.T) {
	t.Parallel()
	f := newFake(3)
	var abandoned sync.Map
	var groupCtxErr atomic.Value
	c := &storekit.Coalescer[*op]{MaxBatch: 64, InFlight: 1,
		Exec: func(ctx context.Context, ops []*op) {
			f.exec(ctx, ops)
			if len(ops) > 1 {
				groupCtxErr.Store(fmt.Sprint(ctx.Err()))
			}
		},
		Abandoned: func(o *op) { abandoned.Store(o.n, o.got) },
		Wrap:      func(err error) error { return fmt.Errorf("wrapped: %w", err) },
	}
	var wg sync.WaitGroup
	wg.Go(func() { _ = c.Do(context.Background(), &op{n: 0}) })
	waitUntil(t, "the lone call in flight", func() bool { return len(f.storeCalls()) == 1 })

	// Call 1 gives up while queued; calls 2 and 3 wait in the group that
	// follows, and 2 gives up while that group is in flight.
	ctx1, cancel1 := context.WithCancel(context.Background())
	ctx2, cancel2 := context.WithCancel(context.Background())
	var err1, err2, err3 error
	o3 := &op{n: 3}
	done1 := make(chan struct{})
	go func() { err1 = c.Do(ctx1, &op{n: 1}); close(done1) }()
	waitUntil(t, "call 1 queued", func() bool { return c.Queued() == 1 })
	cancel1()
	<-done1
	done2 := make(chan struct{})
	go func() { err2 = c.Do(ctx2, &op{n: 2}); close(done2) }()
	waitUntil(t, "call 2 queued", func() bool { return c.Queued() == 2 })
	wg.Go(func() { err3 = c.Do(context.Background(), o3) })
	waitUntil(t, "calls 2 and 3 queued", func() bool { return c.Queued() == 3 })
	f.release <- struct{}{} // the lone call returns; the group goes out
	waitUntil(t, "the group in flight", func() bool { return len(f.storeCalls()) == 2 })
	cancel2()
	<-done2 // call 2 returned while its group is in flight
	close(f.release)
	wg.Wait()

	if !errors.Is(err1, context.Canceled) || !errors.Is(err2, context.Canceled) ||
		err1.Error() != "wrapped: context canceled" {
		t.Errorf("the callers that gave up got %v and %v, want their context's cause, wrapped", err1, err2)
	}
	if err3 != nil || o3.got != 6 {
		t.Errorf("the caller that waited got %v, %d", err3, o3.got)
	}
	if calls := f.storeCalls(); fmt.Sprint(calls) != "[[0] [2 3]]" {
		t.Errorf("store calls %v, want call 1 never sent", calls)
	}
	waitUntil(t, "Abandoned to see call 2", func() bool { _, ok := abandoned.Load(2); return ok })
	if got, _ := abandoned.Load(2); got != 4 {
		t.Errorf("Abandoned saw call 2 with %v, want its answer 4", got)
	}
	if _, ok := abandoned.Load(3); ok {
		t.Error("Abandoned saw call 3, whose caller waited")
	}
	if got := groupCtxErr.Load(); got != "<nil>" {
		t.Errorf("the group's context ended: %v", got)
	}
}

// TestCoalescerWeight: a group stops short of MaxWeight; a call heavier
// than MaxWeight on its own still goes, alone.
func TestCoalescerWeight(t *testing.T) {
	t.Parallel()
	f := newFake(1)
	c := &storekit.Coalescer[*op]{MaxBatch: 64, InFlight: 1, Exec: f.exec,
		Weight: func(o *op) int { return o.n }, MaxWeight: 10}
	ctx := context.Background()
	var wg sync.WaitGroup
	wg.Go(func() { _ = c.Do(ctx, &op{n: 0}) })
	waitUntil(t, "the lone call in flight", func() bool { return len(f.storeCalls()) == 1 })
	for i, n := range []int{4, 5, 3, 20, 1} {
		o := &op{n: n}
		wg.Go(func() { _ = c.Do(ctx, o) })
		waitUntil(t, "the call queued", func() bool { return c.Queued() == i+1 })
	}
	close(f.release)
	wg.Wait()
	if calls := f.storeCalls(); fmt.Sprint(calls) != "[[0] [4 5 1] [3] [20]]" {
		t.Fatalf("store calls %v, want [[0] [4 5 1] [3] [20]]", calls)
	}
}

// TestCoalescerLonePanic: a lone call whose store call panics passes the
// panic to its caller and gives its slot back, so the calls after it are
// still sent (a kept slot would leave them queued with no sender).
func TestCoalescerLonePanic(t *testing.T) {
	t.Parallel()
	c := &storekit.Coalescer[*op]{MaxBatch: 8, InFlight: 1, Exec: func(_ context.Context, ops []*op) {
		for _, o := range ops {
			if o.n == 13 {
				panic("store call panicked")
			}
			o.got = 2 * o.n
		}
	}}
	func() {
		defer func() {
			if r := recover(); r != "store call panicked" {
				t.Errorf("recovered %v, want the store call's panic", r)
			}
		}()
		_ = c.Do(context.Background(), &op{n: 13})
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	o := &op{n: 2}
	if err := c.Do(ctx, o); err != nil || o.got != 4 {
		t.Fatalf("the call after the panic: %v, got %d", err, o.got)
	}
}
