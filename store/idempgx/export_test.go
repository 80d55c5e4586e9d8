package idempgx

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
