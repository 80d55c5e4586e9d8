package idemredis

// StepsKey is the key of the steps of (scope, key), for tests.
func (s *Store) StepsKey(scope, key string) string { return s.stepsKey(scope, key) }
