package idemmysql

import "strings"

// ExtendsQueued is how many Extends wait for a group now.
func ExtendsQueued(s *Store) int { return s.extends.Queued() }

// CompletesQueued is how many Completes wait for a group now.
func CompletesQueued(s *Store) int { return s.completes.Queued() }

// ExtendAlone makes every Extend of s statements of its own, as before
// heartbeats were grouped, for side-by-side benchmarks.
func ExtendAlone(s *Store) { s.extends.InFlight = 1 << 30 }

// CompleteAlone is ExtendAlone for Complete.
func CompleteAlone(s *Store) { s.completes.InFlight = 1 << 30 }

// GroupStatement names the group statement query is ("extend", "extend
// read", "complete lock", "complete"), or returns "" for any other.
func GroupStatement(query string) string {
	for name, g := range map[string]groupStatement{"extend": extendGroupSQL, "extend read": extendReadSQL,
		"complete lock": completeLockSQL, "complete": completeGroupSQL} {
		if strings.HasPrefix(query, g.head+g.first) && strings.HasSuffix(query, g.tail) {
			return name
		}
	}
	return ""
}
