package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// Options tune the suite for a store.
type Options struct {
	// MaxResultBytes is the store's configured result limit, used to check
	// that larger results become tombstones. Zero means
	// idem.DefaultMaxResultBytes.
	MaxResultBytes int
	// ClockPrecision is the resolution of the times the store keeps (one
	// microsecond for PostgreSQL, one millisecond for Redis). Durations
	// computed from stored times are compared with this tolerance. Zero
	// means one millisecond.
	ClockPrecision time.Duration
	// ExpiresByTTL says that the backend deletes expired completed records
	// by itself (Redis key expiry), so Purge may find fewer of them, even
	// none, left to remove. The expired records must still be gone.
	ExpiresByTTL bool
}

// Run runs the Store conformance suite as parallel subtests of one subtest
// named "Store", and returns when all of them have finished, so resources the
// caller releases with defer outlive the suite. newStore is called once per
// subtest and must return a store over an isolated namespace (its own schema,
// database file or key prefix): subtests run in parallel, and Purge must see
// only its own subtest's records. opts may be nil.
func Run(t *testing.T, newStore func(t *testing.T) idem.Store, opts *Options) {
	t.Helper()
	runStore(t, newStore, opts)
}

// ProcessEnv is one isolated environment for the transactional path: a store
// module adapts its Process functions to it. The effect of a message is one
// row, keyed by the message key, inserted in an effects table inside the
// same transaction as the dedupe record.
type ProcessEnv interface {
	// Process runs the store's single-message Process for msg. The handler
	// inserts the effect row for msg.Key and then returns fail (nil for
	// success), so a non-nil fail must roll the effect back.
	Process(ctx context.Context, msg idem.Message, fail error) (idem.Outcome, error)
	// ProcessBatch runs the store's batch Process. The handler inserts one
	// effect row for each fresh message it is handed, then returns fail.
	ProcessBatch(ctx context.Context, msgs []idem.Message, fail error) ([]idem.Outcome, error)
	// Effects returns the number of effect rows per key.
	Effects(ctx context.Context) (map[string]int, error)
}

// RunProcess runs the transactional-path suite as parallel subtests of one
// subtest named "Process", and returns when all of them have finished.
// newEnv is called once per subtest and must return an isolated environment
// (its own dedupe and effects tables), safe for concurrent use by dozens of
// goroutines. The effects table must not be unique on the key: the suite
// counts a second effect after a dedupe window passed.
func RunProcess(t *testing.T, newEnv func(t *testing.T) ProcessEnv) {
	t.Helper()
	runProcess(t, newEnv)
}
