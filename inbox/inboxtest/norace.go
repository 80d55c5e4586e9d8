//go:build !race

package inboxtest

const raceEnabled = false
