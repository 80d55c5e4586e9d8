//go:build race

package inboxtest

// raceEnabled: the race detector slows worker processes (and SQLite's
// transpiled C) several times, so the acceptance test's default size
// shrinks under -race.
const raceEnabled = true
