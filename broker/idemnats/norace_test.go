//go:build !race

package idemnats_test

const raceEnabled = false
