package consumetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Point marks a place in the handler where a consumer can be interrupted:
// typically right before the effect, and between the effect and the commit
// of the transaction that holds it. Outside [Run] it does nothing (ctx
// carries no fault), so it costs one context lookup in production code
// that leaves it in.
//
// Run counts the points a clean delivery passes and then, in the Cancel,
// Panic and Kill scenarios, interrupts one delivery at each of them in
// turn: it cancels ctx there (the handler's next context-aware call fails,
// as on a shutdown), panics there, or SIGKILLs the process there. A
// handler without points is interrupted at delays spread over its
// measured duration instead, which hits the same places by chance only.
//
// Call it on the goroutine that runs Deliver (a panic on another goroutine
// cannot be recovered), with the context the handler was given or one
// derived from it.
func Point(ctx context.Context) {
	if in, _ := ctx.Value(injectorKey{}).(*injector); in != nil {
		in.point()
	}
}

// ErrCanceled is the cause of a delivery's context cancelled by the Cancel
// scenario (context.Cause returns it).
var ErrCanceled = errors.New("consumetest: delivery cancelled mid-handler")

type injectorKey struct{}

type fault int

const (
	noFault fault = iota
	cancelFault
	panicFault
	killFault
)

func (f fault) String() string {
	return [...]string{"none", "cancelled", "panicked", "killed"}[f]
}

// injector counts one delivery's points and fires its fault at point at
// (or, when at is 0 and after is positive, after that delay).
type injector struct {
	kind  fault
	at    int
	after time.Duration
	// kill reports point n to the parent process and blocks until it is
	// killed (child processes only).
	kill func(n int)

	cancel context.CancelCauseFunc // set by the delivery

	mu    sync.Mutex
	n     int
	fired bool
}

// injectedPanic is the value the Panic scenario panics with.
type injectedPanic struct{ point int }

func (p injectedPanic) String() string {
	return fmt.Sprintf("consumetest: panic injected at point %d", p.point)
}

func (in *injector) point() {
	in.mu.Lock()
	in.n++
	n := in.n
	fire := in.at != 0 && n == in.at && !in.fired
	if fire {
		in.fired = true
	}
	in.mu.Unlock()
	if !fire {
		return
	}
	switch in.kind {
	case cancelFault:
		in.cancel(ErrCanceled)
	case panicFault:
		panic(injectedPanic{point: n})
	case killFault:
		in.kill(n)
	}
}

// passed returns how many points the delivery passed and whether the
// fault fired.
func (in *injector) passed() (int, bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.n, in.fired
}

// timed fires a timed cancellation.
func (in *injector) timed() {
	in.mu.Lock()
	in.fired = true
	in.mu.Unlock()
	in.cancel(ErrCanceled)
}
