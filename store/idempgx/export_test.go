package idempgx

// BatchFolds reports whether s's next ProcessBatch reads the existing
// records in its first statement (see insertBatch).
func BatchFolds(s *Store) bool { return s.batchDups.Load() }
