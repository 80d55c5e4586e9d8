package idemstoretest_test

import (
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/store/idemstoretest"
)

// A store module runs the suite from one test. Here the store is the
// in-memory one from idemtest; a real store returns a fresh schema,
// database file or key prefix for every call and removes it in t.Cleanup.
func Example() {
	testConformance := func(t *testing.T) {
		idemstoretest.Run(t, func(t *testing.T) idem.Store {
			return idemtest.NewMemoryStore(nil)
		}, &idemstoretest.Options{MaxResultBytes: idem.DefaultMaxResultBytes})
	}
	_ = testConformance
}
