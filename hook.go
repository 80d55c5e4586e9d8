package idem

import "context"

// Hook is a value that observes idem's work. Every component's Config takes
// Hooks []Hook and calls whichever of the optional hook interfaces each
// implements ([DoStartHook], [DoEndHook], consume.DeliveryStartHook,
// inbox.RunEndHook, idemhttp.RequestStartHook, …), so that one value (a
// metrics collector, a tracer) serves every component it is given to. A
// start hook returns the context the work runs with, so spans opened there
// are the parents of the work's own spans and the end hook receives that
// context.
//
// Hooks are called from the goroutine doing the work: they must be safe
// for concurrent use and fast.
type Hook any

// HooksOf returns the hooks that implement T, in order.
func HooksOf[T any](hooks []Hook) []T {
	var out []T
	for _, h := range hooks {
		if t, ok := h.(T); ok {
			out = append(out, t)
		}
	}
	return out
}

// DoStartHook is called when [Guard.Do] starts, with Scope and Key set. The
// context it returns is the one Do (and the guarded function) runs with.
type DoStartHook interface {
	OnDoStart(ctx context.Context, ev DoEvent) context.Context
}

// DoEndHook is called once at the end of every [Guard.Do] (also when the
// function panics, before the panic goes on).
type DoEndHook interface {
	OnDoEnd(ctx context.Context, ev DoEvent)
}
