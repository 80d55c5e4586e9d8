//go:build !race

package outboxtest

const raceEnabled = false
