// Package idemstoretest is the conformance suite every idem store runs
// against a real backend.
//
//	func TestConformance(t *testing.T) {
//		idemstoretest.Run(t, func(t *testing.T) idem.Store { return newIsolatedStore(t) })
//	}
//
// SQL stores that offer the transactional path also run [RunProcess].
package idemstoretest

import (
	"context"
	"testing"

	"github.com/idem-go/idem"
)

// Options tune the suite for a store.
type Options struct {
	// MaxResultBytes is the store's configured result limit, used to check
	// that larger results become tombstones. Zero means
	// idem.DefaultMaxResultBytes.
	MaxResultBytes int
}

// Run runs the Store conformance suite. newStore must return a store over an
// isolated namespace (its own schema, database file or key prefix) so that
// subtests can run in parallel.
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
	Process(ctx context.Context, msg idem.Message, fail error) (idem.ProcessResult, error)
	// ProcessBatch runs the store's batch Process. The handler inserts one
	// effect row for each fresh message it is handed, then returns fail.
	ProcessBatch(ctx context.Context, msgs []idem.Message, fail error) ([]idem.ProcessResult, error)
	// Effects returns the number of effect rows per key.
	Effects(ctx context.Context) (map[string]int, error)
}

// RunProcess runs the transactional-path suite. newEnv must return an
// isolated environment for each call.
func RunProcess(t *testing.T, newEnv func(t *testing.T) ProcessEnv) {
	t.Helper()
	runProcess(t, newEnv)
}
