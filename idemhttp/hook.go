package idemhttp

import "context"

// RequestStartHook is called when the middleware (or the proxy) starts
// handling a request that carries an idempotency key, with Request,
// ScopeHash and Key set. The context it returns is the request's context
// from then on: the handler (or the upstream call) runs with it.
type RequestStartHook interface {
	OnRequestStart(ctx context.Context, ev Event) context.Context
}

// RequestEndHook is called once per request the middleware handled, with
// its outcome and status.
type RequestEndHook interface {
	OnRequestEnd(ctx context.Context, ev Event)
}
