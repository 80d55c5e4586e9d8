package storetest_test

import (
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/idemtest/storetest"
)

// A store module runs the suite from one test. Here the store is the
// in-memory one from idemtest; a real store returns a fresh schema,
// database file or key prefix for every call and removes it in t.Cleanup.
func Example() {
	testConformance := func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) idem.Store {
			return idemtest.NewMemoryStore(nil)
		}, &storetest.Options{MaxResultBytes: idem.DefaultMaxResultBytes})
	}
	_ = testConformance
}
