// Package idemtest holds helpers for testing code that uses idem.
//
// # Memory store
//
// [NewMemoryStore] returns an [idem.Store] kept in a map in process memory,
// for unit tests only. It follows the whole Store contract (fencing tokens,
// leases, retention, tombstones, fingerprint mismatches) and passes the
// conformance suite in idemtest/storetest, but its records vanish with the
// process, so it reports Durable() == false: components that promise
// exactly-once effects across restarts refuse it unless a test says
// otherwise. Never use it in production; use store/idemsqlite or
// store/idempgx.
//
// # Moving time
//
// A [Clock] is a manual clock for [MemoryOptions].Now: a test advances it to
// expire leases and retention windows instantly instead of sleeping.
package idemtest
