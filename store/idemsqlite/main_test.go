package idemsqlite

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine running (a
// worker, a heartbeat, a write waiting in the queue).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
