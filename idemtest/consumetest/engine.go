package consumetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idem-go/idem/consume"
)

// ErrDeadLettered is wrapped by an error from Target.Deliver when the
// consumer dead-lettered the message: the kit does not deliver it again,
// as a broker would not, and a message that should have taken effect is
// then reported lost.
var ErrDeadLettered = errors.New("consumetest: dead-lettered")

// Engine returns a Target.Deliver that hands every delivery to e, the
// engine behind idem's broker adapters, as an adapter would: with the
// retry state of the id's earlier deliveries, so that e's retry policy
// and dead letters apply. It returns nil when e acknowledged the delivery
// (processed, or a duplicate), an error wrapping [ErrDeadLettered] when e
// dead-lettered it (a changed body: Rejected), and another error, with
// the handler's last error, when e asked for a redelivery (retried,
// requeued or abandoned).
//
// It panics if e is nil.
func Engine(e *consume.Engine) func(ctx context.Context, d Delivery) error {
	if e == nil {
		panic("consumetest: Engine needs a consume.Engine")
	}
	var (
		mu     sync.Mutex
		states = map[string]consume.State{}
	)
	return func(ctx context.Context, d Delivery) error {
		mu.Lock()
		st := states[d.ID]
		mu.Unlock()
		ed := &engineDelivery{d: d, st: st}
		out, err := e.Handle(ctx, ed)
		if err != nil {
			return fmt.Errorf("consumetest: settling %s: %w", out, err)
		}
		mu.Lock()
		defer mu.Unlock()
		switch ed.settled {
		case "ack":
			delete(states, d.ID)
			return nil
		case "dead-letter":
			delete(states, d.ID)
			return fmt.Errorf("%w (%s): %s", ErrDeadLettered, ed.dl.Reason, ed.dl.LastError)
		case "retry":
			states[d.ID] = ed.next
			return fmt.Errorf("consumetest: retried (attempt %d): %s", ed.next.Attempts, ed.next.LastError)
		}
		return fmt.Errorf("consumetest: %s", out) // requeued or abandoned: redelivered unchanged
	}
}

// engineDelivery is a consume.Delivery that records how the engine
// settled it.
type engineDelivery struct {
	d       Delivery
	st      consume.State
	settled string
	next    consume.State
	dl      consume.DeadLetter
}

func (ed *engineDelivery) ID() string                { return ed.d.ID }
func (ed *engineDelivery) Body() []byte              { return ed.d.Body }
func (ed *engineDelivery) Origin() string            { return "consumetest" }
func (ed *engineDelivery) State() consume.State      { return ed.st }
func (ed *engineDelivery) Ack(context.Context) error { ed.settled = "ack"; return nil }
func (ed *engineDelivery) Requeue(context.Context) error {
	ed.settled = "requeue"
	return nil
}
func (ed *engineDelivery) Retry(_ context.Context, _ time.Duration, st consume.State) error {
	ed.settled, ed.next = "retry", st
	return nil
}
func (ed *engineDelivery) DeadLetter(_ context.Context, dl consume.DeadLetter) error {
	ed.settled, ed.dl = "dead-letter", dl
	return nil
}

var _ consume.Delivery = (*engineDelivery)(nil)
