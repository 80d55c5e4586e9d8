package consume

import (
	"context"
	"errors"

	"github.com/idem-go/idem"
)

// GuardProcess adapts an idem.Guard to a [ProcessFunc], for effects outside
// the dedupe store's database (an email, a call to a payment API):
//
//   - a first run of handler stores its completion: Processed;
//   - a completed key replays: Duplicate, the handler does not run (a
//     recorded idem.Final error also counts as done: the message was
//     dead-lettered the first time);
//   - another consumer holding the lease, or a lost lease, is an
//     infrastructure error: retried later, not counted;
//   - a different payload under the same id: Mismatch.
//
// A completion is kept for msg.Retention, the consumer's Config.Retention
// (the window its start-up check validated against the redelivery
// horizon), not the Guard's GuardConfig.Retention.
//
// The handler receives the Guard's Run so it can derive downstream
// idempotency keys from it.
func GuardProcess(g *idem.Guard, handler func(ctx context.Context, run idem.Run, d Delivery) error) ProcessFunc {
	return func(ctx context.Context, msg idem.Message, d Delivery) (idem.Outcome, error) {
		res, err := g.Do(ctx, idem.Call(msg),
			func(ctx context.Context, run idem.Run) ([]byte, error) { return nil, handler(ctx, run, d) })
		var stored *idem.StoredError
		switch {
		case err == nil && res.Replayed, errors.Is(err, idem.ErrResultDiscarded), errors.As(err, &stored):
			return idem.Duplicate, nil
		case err == nil:
			return idem.Processed, nil
		case errors.Is(err, idem.ErrFingerprintMismatch):
			return idem.Mismatch, err
		case errors.Is(err, idem.ErrInProgress), errors.Is(err, idem.ErrLeaseLost):
			return "", idem.Retryable(err)
		}
		return "", err
	}
}
