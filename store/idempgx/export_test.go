package idempgx

import "time"

// ProcessLookupSQL is the statement ProcessBatch classifies a batch's
// conflicted keys with, for the test of its generic plan.
func ProcessLookupSQL(s *Store) string { return s.q.processLookup }

// ExtendBatchSQL is the statement concurrent Extends share.
func ExtendBatchSQL(s *Store) string { return s.q.extendBatch }

// ExtendsQueued is how many Extends wait for a statement now.
func ExtendsQueued(s *Store) int { return s.extends.Queued() }

// ExtendAlone makes every Extend of s a statement of its own, as before
// heartbeats shared statements, for side-by-side benchmarks.
func ExtendAlone(s *Store) { s.extends.InFlight = 1 << 30 }

// CompleteBatchSQL is the statement concurrent Completes share.
func CompleteBatchSQL(s *Store) string { return s.q.completeBatch }

// CompletesQueued is how many Completes wait for a statement now.
func CompletesQueued(s *Store) int { return s.completes.Queued() }

// CompleteAlone is ExtendAlone for Complete.
func CompleteAlone(s *Store) { s.completes.InFlight = 1 << 30 }

// CopyLooksFirst reports whether s's next COPY batch looks its keys up
// first.
func CopyLooksFirst(s *Store) bool { return s.copy.lookupFirst() }

// SetCopyLooksFirst sets what recent batches met, as if every one had met
// a stored key (true) or none had (false).
func SetCopyLooksFirst(s *Store, met bool) {
	if met {
		s.copy.seen.Store(copySeenMax)
	} else {
		s.copy.seen.Store(0)
	}
}

// CopyPauseMin is the first pause of the COPY path after a COPY met a
// key stored concurrently.
const CopyPauseMin = copyPauseMin

// CopyPause returns when the COPY path's pause ends (zero: never paused)
// and the next pause.
func CopyPause(s *Store) (until time.Time, next time.Duration) {
	if u := s.copy.until.Load(); u != 0 {
		until = time.Unix(0, u)
	}
	return until, time.Duration(s.copy.pause.Load())
}

// SetCopyPauseUntil makes the COPY path's pause end at until.
func SetCopyPauseUntil(s *Store, until time.Time) { s.copy.until.Store(until.UnixNano()) }

// CopyMinKeys is the fewest distinct keys ProcessBatch copies.
const CopyMinKeys = copyMinKeys

// ProcessBatchSQL returns the statements ProcessBatch inserts a batch's
// records with: its first pass, and the pass that takes rows over.
func ProcessBatchSQL(s *Store) (first, takeover string) {
	return s.q.processBatchNew, s.q.processBatch
}
