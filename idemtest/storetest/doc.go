// Package storetest is the conformance suite every idem store runs
// against a real backend, so that all stores keep the idem.Store contract
// the same way.
//
// # Wiring a store
//
// A store module calls [Run] from one test, with a constructor that returns
// a store over its own namespace (schema, database file or key prefix):
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) idem.Store {
//			return newIsolatedStore(t) // cleanup via t.Cleanup
//		}, &storetest.Options{MaxResultBytes: limit, ClockPrecision: time.Microsecond})
//	}
//
// SQL stores that offer the transactional path also call [RunProcess] with
// a [ProcessEnv] that adapts their Process functions and owns an effects
// table.
//
// # What it checks
//
// [Run] checks claim races (64 concurrent claims, one winner), fencing
// tokens (stale, wrong and missing tokens get idem.ErrLeaseLost; tokens
// strictly increase across takeover, Release, Delete and Purge), lease
// takeover, replay of completed results byte for byte, fingerprint
// mismatches on the claim, replay and conflict paths, retention from one
// second to thirty days by the store's clock, purging in small batches,
// tombstones for oversized results, literal storage of keys full of quotes,
// wildcards and delimiters, input validation and cancelled contexts.
//
// [RunProcess] checks the transactional path: one effect per message,
// duplicates and mismatches without effects, rollback on handler failure,
// the dedupe window, batches judged message by message, concurrent batches
// over overlapping keys, and the acceptance test of the project: 1,000
// messages delivered three times each, in random order, to 32 goroutines,
// end with exactly 1,000 effects.
//
// [RunSteps] checks a store's [idem.StepStore] (the recovery points of
// idem.Steps): steps recorded in order with the record's fingerprint,
// fencing by the record's token, steps surviving Release and takeover,
// bounds, Delete and expiry, and holders racing a takeover: a step write
// of the old holder commits before the claim that takes over or fails.
// [RunStepsTx] checks a SQL store's transactional steps
// ([idem.StepTxStore]): effect and step commit together or not at all.
// Both are separate from Run, so a store without steps still passes Run.
//
// [RunList] checks a store's [idem.Lister]: every filter (key across
// scopes, key and scope prefixes taken literally, scope hash, state,
// creation and expiry ranges) against the records Get reads, pages of 1 to
// idem.MaxListLimit that end, cursors and limits refused when invalid. It is
// separate from Run, so a store without a listing still passes Run.
//
// Every failure message starts with "contract:" and names the rule that
// was broken.
//
// # Timing
//
// Subtests run in parallel, each on its own store. The checks that need a
// lease or retention to pass share one wait of 1.2 s, so the suite takes a
// couple of seconds plus the backend's own time. Run and RunProcess return
// only when their subtests have finished.
package storetest
