package storekit

import (
	"context"
	"errors"
	"testing"
	"time"
)

type ctxCall struct{ Pending }

func callsWith(ctxs ...context.Context) []*ctxCall {
	calls := make([]*ctxCall, len(ctxs))
	for i, ctx := range ctxs {
		calls[i] = &ctxCall{Pending{ctx: ctx}}
	}
	return calls
}

type key struct{}

// TestGroupContext: a group's context outlives every caller's but the
// last, ends with the last (with its cause), keeps Exec's values, and
// ends when the store call is done; a lone call sent with its own context
// gets that context.
func TestGroupContext(t *testing.T) {
	exec := context.WithValue(context.Background(), key{}, "span")
	a, cancelA := context.WithCancel(context.Background())
	defer cancelA()
	b, cancelB := context.WithCancelCause(context.Background())
	defer cancelB(nil)
	c, cancelC := context.WithTimeout(context.Background(), time.Hour)
	defer cancelC()

	gctx, done := GroupContext(exec, callsWith(a, b, c))
	if gctx.Value(key{}) != "span" {
		t.Errorf("the group's context lost Exec's values")
	}
	cancelA()
	cancelC()
	select {
	case <-gctx.Done():
		t.Fatalf("the group's context ended with a caller still waiting: %v", context.Cause(gctx))
	case <-time.After(20 * time.Millisecond):
	}
	gone := errors.New("the last caller gave up")
	cancelB(gone)
	select {
	case <-gctx.Done():
	case <-time.After(time.Minute):
		t.Fatal("the group's context outlived every caller")
	}
	if !errors.Is(context.Cause(gctx), gone) {
		t.Errorf("cause %v, want the last caller's", context.Cause(gctx))
	}
	done()

	// Done ends the group's context, and its callers' contexts no longer
	// reach it.
	d, cancelD := context.WithCancel(context.Background())
	defer cancelD()
	gctx, done = GroupContext(exec, callsWith(d, context.Background()))
	done()
	if gctx.Err() == nil {
		t.Errorf("the group's context lives on after done")
	}

	// A lone call with its own context.
	lone := callsWith(d)
	if gctx, done := GroupContext(d, lone); gctx != d {
		t.Errorf("a lone call's context was wrapped")
	} else {
		done()
	}
	// A lone call whose Exec context is not its own still ends with it.
	gctx, done = GroupContext(exec, lone)
	defer done()
	cancelD()
	select {
	case <-gctx.Done():
	case <-time.After(time.Minute):
		t.Fatal("a lone call's context ended, its store call's did not")
	}
}
