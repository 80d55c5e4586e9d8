//go:build race

package outboxtest

// raceEnabled: the race detector slows relay processes several times, so
// the acceptance test's default size shrinks under -race.
const raceEnabled = true
