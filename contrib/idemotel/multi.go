package idemotel

import (
	"context"
	"net/http"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/inbox"
)

// The components take one hook each; these combine several (idemotel with
// idemprom, or with your own logging), calling them in order. Nil hooks
// are skipped, so optional ones can be passed as they are.

// MultiConsumeHooks returns hooks for consume.Config.Hooks that call each
// of hooks in order.
func MultiConsumeHooks(hooks ...consume.Hooks) consume.Hooks {
	hs := make([]consume.Hooks, 0, len(hooks))
	for _, h := range hooks {
		if h != nil {
			hs = append(hs, h)
		}
	}
	return consume.HooksFunc(func(ctx context.Context, ev consume.Event) {
		for _, h := range hs {
			h.OnDelivery(ctx, ev)
		}
	})
}

// MultiInboxHook returns a function for inbox.Config.OnEvent that calls
// each of hooks in order.
func MultiInboxHook(hooks ...func(inbox.Event)) func(inbox.Event) {
	hs := make([]func(inbox.Event), 0, len(hooks))
	for _, h := range hooks {
		if h != nil {
			hs = append(hs, h)
		}
	}
	return func(ev inbox.Event) {
		for _, h := range hs {
			h(ev)
		}
	}
}

// MultiHTTPHook returns a function for idemhttp.Config.OnRequest that
// calls each of hooks in order.
func MultiHTTPHook(hooks ...func(*http.Request, idemhttp.Event)) func(*http.Request, idemhttp.Event) {
	hs := make([]func(*http.Request, idemhttp.Event), 0, len(hooks))
	for _, h := range hooks {
		if h != nil {
			hs = append(hs, h)
		}
	}
	return func(r *http.Request, ev idemhttp.Event) {
		for _, h := range hs {
			h(r, ev)
		}
	}
}

// MultiGuardHook returns a function for idem.GuardConfig.OnDo that calls
// each of hooks in order.
func MultiGuardHook(hooks ...func(context.Context, idem.DoEvent)) func(context.Context, idem.DoEvent) {
	hs := make([]func(context.Context, idem.DoEvent), 0, len(hooks))
	for _, h := range hooks {
		if h != nil {
			hs = append(hs, h)
		}
	}
	return func(ctx context.Context, ev idem.DoEvent) {
		for _, h := range hs {
			h(ctx, ev)
		}
	}
}
