// Package hooklabel turns what idem's hooks report into metric label
// values that cannot grow without bound: outcomes (idem.Outcome),
// dead-letter reasons (idem.DeadReason), HTTP status classes, and
// free-form names (consumers, event types, routes, guard names) capped by
// a [Set].
//
// contrib/idemprom and contrib/idemotel both label their metrics with it,
// so that the two report the same values for the same events. A value a
// metrics module does not know, such as an outcome added to idem after the
// module was built, becomes [Other] rather than a new series.
package hooklabel

import (
	"sync"
	"unicode/utf8"

	"github.com/idem-go/idem"
)

// Other replaces a label value outside its fixed set, an empty or invalid
// one, or one beyond a [Set]'s cap.
const Other = "other"

// consumeOutcomes are the outcomes a consume.Engine reports, in the order
// idem declares them.
var consumeOutcomes = [...]idem.Outcome{
	idem.Processed, idem.Duplicate, idem.Panicked, idem.Retried, idem.DeadLettered, idem.Requeued, idem.Abandoned,
}

// ConsumeOutcomes returns the outcomes a consume.Engine reports, for
// creating a consumer's delivery series at zero. The slice is new on each
// call.
func ConsumeOutcomes() []idem.Outcome {
	return append([]idem.Outcome(nil), consumeOutcomes[:]...)
}

// DeadReason returns the label value of a dead-letter reason: the reason
// itself when idem declares it, else [Other].
func DeadReason(r idem.DeadReason) string {
	switch r {
	case idem.DeadMaxAttempts, idem.DeadPermanent, idem.DeadMismatch,
		idem.DeadMissingID, idem.DeadInvalidID, idem.DeadNoHandler:
		return string(r)
	}
	return Other
}

// outcomes are the idem.Outcome values, in the order idem declares them.
var outcomes = [...]idem.Outcome{
	idem.Acquired, idem.Completed,
	idem.Processed, idem.Duplicate, idem.Mismatch, idem.InProgress, idem.Released, idem.LeaseLost,
	idem.Panicked, idem.Rejected, idem.Errored, idem.NotRecorded,
	idem.Retried, idem.DeadLettered, idem.Requeued, idem.Abandoned,
	idem.Discarded, idem.Tombstoned, idem.Canceled, idem.InDoubt,
}

// Outcome returns the label value of an outcome, whichever component
// reported it: the outcome itself when idem declares it, else [Other].
func Outcome(o idem.Outcome) string {
	for _, known := range outcomes {
		if o == known {
			return string(o)
		}
	}
	return Other
}

var statusClasses = [...]string{"1xx", "2xx", "3xx", "4xx", "5xx"}

// StatusClass returns "1xx" to "5xx" for an HTTP status code, else [Other]
// (0 when no response was written, or a code out of range).
func StatusClass(status int) string {
	if status < 100 || status > 599 {
		return Other
	}
	return statusClasses[status/100-1]
}

// Set admits at most a fixed number of distinct label values; later ones
// become [Other], so that a misbehaving producer (event types from a
// partner, consumer names built from input) cannot create unbounded
// series. It is safe for concurrent use.
type Set struct {
	limit int
	mu    sync.RWMutex
	seen  map[string]struct{}
}

// NewSet returns a Set that admits up to limit values (none when limit is
// zero or less).
func NewSet(limit int) *Set {
	return &Set{limit: limit, seen: make(map[string]struct{})}
}

// Label returns the label value for v: v itself if it is admitted, else
// [Other]. first is true for the one call that admitted v, so that the
// caller can create v's series at zero exactly once. An empty value or
// invalid UTF-8 is [Other] and never admitted: Prometheus panics on
// invalid UTF-8, OpenTelemetry exporters drop the batch, and an empty
// value reads as a missing label.
func (s *Set) Label(v string) (label string, first bool) {
	if v == "" || !utf8.ValidString(v) {
		return Other, false
	}
	s.mu.RLock()
	_, ok := s.seen[v]
	s.mu.RUnlock()
	if ok {
		return v, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.seen[v]; ok {
		return v, false
	}
	if len(s.seen) >= s.limit {
		return Other, false
	}
	s.seen[v] = struct{}{}
	return v, true
}
