//go:build race

package idemnats_test

// raceEnabled shortens the crash test: the race detector slows the
// consumer processes several times over.
const raceEnabled = true
