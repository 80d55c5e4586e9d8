package idempgx

// ProcessLookupSQL is the statement ProcessBatch classifies a batch's
// conflicted keys with, for the test of its generic plan.
func ProcessLookupSQL(s *Store) string { return s.q.processLookup }
