package consume

import "context"

// DeliveryStartHook is called when the engine starts handling a delivery,
// with Consumer, ID, Key and Attempt set. The context it returns is the one
// the delivery is handled (and the handler runs) with.
type DeliveryStartHook interface {
	OnDeliveryStart(ctx context.Context, ev Event) context.Context
}

// DeliveryEndHook is called once per handled delivery, with its outcome.
type DeliveryEndHook interface {
	OnDeliveryEnd(ctx context.Context, ev Event)
}
