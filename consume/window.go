package consume

import (
	"fmt"
	"time"

	"github.com/idem-go/idem"
)

// Window is one component of a consumer's redelivery horizon: how long
// after a first delivery the same message may still arrive.
type Window struct {
	// Name says where the number comes from, e.g. "queue x-message-ttl"
	// or "JetStream AckWait × MaxDeliver".
	Name string
	D    time.Duration
}

// Horizon returns the redelivery horizon of a retry schedule and broker
// windows: the longest of maxAttempts × maxBackoff and every window, with
// the name of the component that sets it.
func Horizon(maxAttempts int, maxBackoff time.Duration, windows ...Window) Window {
	h := Window{Name: fmt.Sprintf("max_attempts %d × max_backoff %v", maxAttempts, maxBackoff)}
	if maxAttempts > 0 && maxBackoff > 0 {
		if maxBackoff > time.Duration(1<<63-1)/time.Duration(maxAttempts) {
			h.D = time.Duration(1<<63 - 1)
		} else {
			h.D = time.Duration(maxAttempts) * maxBackoff
		}
	}
	for _, w := range windows {
		if w.D > h.D {
			h = w
		}
	}
	return h
}

// CheckRetention returns an error wrapping idem.ErrInvalidConfig, naming
// both numbers, when the dedupe retention is shorter than the redelivery
// horizon: a duplicate arriving after its dedupe record expired would be
// processed a second time. A non-positive retention is an error too.
func CheckRetention(retention time.Duration, maxAttempts int, maxBackoff time.Duration, windows ...Window) error {
	if retention <= 0 {
		return fmt.Errorf("%w: dedupe retention must be positive, got %v", idem.ErrInvalidConfig, retention)
	}
	h := Horizon(maxAttempts, maxBackoff, windows...)
	if retention < h.D {
		return fmt.Errorf("%w: dedupe retention %v is shorter than the redelivery horizon %v (%s); a late duplicate would be processed twice: raise the retention above %v",
			idem.ErrInvalidConfig, retention, h.D, h.Name, h.D)
	}
	return nil
}
