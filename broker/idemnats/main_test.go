package idemnats_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine running: a
// consumer that stopped must have stopped everything it started.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
