package main

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a goroutine outlives the tests: every
// command must close the store (pool, database) it opened. The idem binary
// the process tests share is removed at the end.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) { removeSharedBinary() }))
}
