package storekit

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

type internalCall struct{ Pending }

// TestAwaitReportsTheCallersReason: a group's store call ends with a
// cancellation of its own once every caller's context has ended. A caller
// that sees the group's outcome before its own context's end (on a busy
// machine the sender may run first) must still report its own reason, not
// the group's "context canceled"; other outcomes pass as they are.
func TestAwaitReportsTheCallersReason(t *testing.T) {
	b := &Coalescer[*internalCall]{Wrap: func(err error) error { return fmt.Errorf("wrapped: %w", err) }}
	ended, cancel := context.WithTimeoutCause(context.Background(), 0, errors.New("the caller's deadline"))
	defer cancel()
	<-ended.Done()
	errGroup := fmt.Errorf("store: extend: %w", context.Canceled)
	errLost := errors.New("lease lost")
	for _, tc := range []struct {
		name  string
		ctx   context.Context
		state int32
		err   error
		want  string
	}{
		{"group cancelled, outcome delivered first", ended, callDone, errGroup, "wrapped: the caller's deadline"},
		{"group cancelled, caller still waiting", context.Background(), callDone, errGroup, errGroup.Error()},
		{"another failure as the caller gave up", ended, callDone, errLost, errLost.Error()},
		{"success as the caller gave up", ended, callDone, nil, ""},
		{"still in flight as the caller gave up", ended, callSent, nil, "wrapped: the caller's deadline"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &internalCall{}
			c.done = make(chan struct{})
			c.state.Store(tc.state)
			if tc.state == callDone {
				c.Err = tc.err
				close(c.done)
			}
			got := b.await(tc.ctx, &c.Pending)
			if msg := fmt.Sprint(got); (got == nil) != (tc.want == "") || (got != nil && msg != tc.want) {
				t.Fatalf("await = %v; want %q", got, tc.want)
			}
		})
	}
}
