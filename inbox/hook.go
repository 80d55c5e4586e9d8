package inbox

import "context"

// RunStartHook is called when a worker starts running a claimed row, with
// Message set. The context it returns is the one the handler runs with.
type RunStartHook interface {
	OnRunStart(ctx context.Context, ev Event) context.Context
}

// RunEndHook is called once per run, with its outcome.
type RunEndHook interface {
	OnRunEnd(ctx context.Context, ev Event)
}
