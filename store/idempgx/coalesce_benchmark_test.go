package idempgx_test

import (
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest/storetest"
	"github.com/idem-go/idem/store/idempgx"
)

// BenchmarkHolderBurst: 300 leases heartbeat together and then complete
// together (see [storetest.BenchHolderBurst]), with statements shared and
// with one statement each, side by side on one server.
//
//	go test -run '^$' -bench HolderBurst -benchtime 20x ./store/idempgx
func BenchmarkHolderBurst(b *testing.B) {
	storetest.BenchHolderBurst(b, func(b *testing.B, grouped bool) idem.Store {
		e := newExtendEnv(b, 0, false)
		if !grouped {
			idempgx.ExtendAlone(e.s)
			idempgx.CompleteAlone(e.s)
		}
		return e.s
	})
}
