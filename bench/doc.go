// Package bench measures idem side by side with the code people would
// otherwise write (the textbook pattern), with its peers (River's unique
// jobs, Watermill's Deduplicator) and with the raw ceilings of each backend
// (a multi-row INSERT … ON CONFLICT DO NOTHING, a pipelined SET NX PX, a
// bare HTTP handler), in one run against the same servers.
//
// It is its own module so that the peers never enter the library's go.mod.
//
// # Running
//
// The command in cmd/idembench runs every [Scenario], prints progress bars on
// stderr and writes BENCHMARKS.md and PNG charts:
//
//	go run ./cmd/idembench --out ../BENCHMARKS.md --charts ../docs/bench
//
// --quick runs every scenario once at a small size (for CI; no timing is
// judged). The same scenarios are Go benchmarks in this package, so
// `go test -bench . -benchtime=1x` exercises each of them once.
//
// # Reading the numbers
//
// Each cell is the median of several runs with its min–max. Absolute
// numbers drift on shared machines; the ratios to the ceiling and to the
// textbook pattern of the same group, measured minutes apart on the same
// servers, are what to read.
package bench
