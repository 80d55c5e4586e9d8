package storekit

import (
	"fmt"

	"github.com/idem-go/idem"
)

// ValidateBatch refuses a batch of more than limit requests, or one with an
// invalid one (validate, e.g. idem.Message.Validate), before the store
// is touched. The error wraps idem.ErrInvalidConfig for the size, and
// validate's error, with the request's index, otherwise.
func ValidateBatch[R any](reqs []R, limit int, validate func(R) error) error {
	if len(reqs) > limit {
		return fmt.Errorf("%w: batch of %d exceeds the limit of %d", idem.ErrInvalidConfig, len(reqs), limit)
	}
	for i, r := range reqs {
		if err := validate(r); err != nil {
			return fmt.Errorf("request %d: %w", i, err)
		}
	}
	return nil
}

// Firsts returns, for each message of a batch, the index of the first
// message with the same (scope, key): i itself for a first occurrence. A
// store judges the first occurrences; [SettleRepeats] settles the others.
func Firsts(msgs []idem.Message) []int {
	type ref struct{ scope, key string }
	seen := make(map[ref]int, len(msgs))
	first := make([]int, len(msgs))
	for i, m := range msgs {
		j, ok := seen[ref{m.Scope, m.Key}]
		if !ok {
			j = i
			seen[ref{m.Scope, m.Key}] = i
		}
		first[i] = j
	}
	return first
}

// SettleRepeats fills in the outcome of every repeated message of a batch
// (first[i] != i, from [Firsts]) once the first occurrences are settled in
// results: the repeat is judged against the record its key now has. That
// is the repeat's first occurrence when it was Processed; otherwise the
// record stored(j) reports for first occurrence j. When stored is nil or
// does not know it (ok false), a repeat of a Mismatch is a Mismatch and any other
// is compared with its first occurrence. An error wrapping
// idem.ErrInProgress means a repeat matches a record a Guard holds.
func SettleRepeats(msgs []idem.Message, first []int, results []idem.Outcome, stored func(j int) (Existing, bool)) error {
	for i, m := range msgs {
		j := first[i]
		if j == i {
			continue
		}
		e, ok := Existing{State: idem.StateCompleted, Fingerprint: msgs[j].Fingerprint}, true
		if results[j] != idem.Processed {
			ok = false
			if stored != nil {
				e, ok = stored(j)
			}
		}
		if !ok {
			if results[j] == idem.Mismatch {
				results[i] = idem.Mismatch
				continue
			}
			e = Existing{State: idem.StateCompleted, Fingerprint: msgs[j].Fingerprint}
		}
		// Settled records: a completed one is live, an in-progress one is
		// held (its first occurrence would have taken it over otherwise).
		e.Expired = false
		e.Live = e.State != idem.StateCompleted
		out, _, err := Judge(e, m)
		if out == idem.Mismatch {
			err = nil
		}
		if err != nil {
			return fmt.Errorf("message %d: %w", i, err)
		}
		results[i] = out
	}
	return nil
}
