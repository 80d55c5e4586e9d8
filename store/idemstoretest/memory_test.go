package idemstoretest_test

import (
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/store/idemstoretest"
)

// The memory store is the reference implementation the suite is proven
// against: a failure here is a bug in the suite or in idemtest.
func TestMemoryStoreConformance(t *testing.T) {
	idemstoretest.Run(t, func(t *testing.T) idem.Store {
		return idemtest.NewMemoryStore(&idemtest.MemoryOptions{MaxResultBytes: 4096})
	}, &idemstoretest.Options{MaxResultBytes: 4096})
}

func TestMemoryStoreConformanceDefaultLimit(t *testing.T) {
	idemstoretest.Run(t, func(t *testing.T) idem.Store {
		return idemtest.NewMemoryStore(nil)
	}, nil)
}
