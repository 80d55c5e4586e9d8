package outbox

import "context"

// PublishStartHook is called before the relay hands a batch to the
// Publisher. The context it returns is the one Publish runs with (so a span
// a hook starts is the parent of the publisher's spans).
type PublishStartHook interface {
	OnPublishStart(ctx context.Context, msgs []Message) context.Context
}

// PublishEndHook is called once per event of a published batch, with its
// outcome and the context the start hooks returned.
type PublishEndHook interface {
	OnPublishEnd(ctx context.Context, r Result)
}
