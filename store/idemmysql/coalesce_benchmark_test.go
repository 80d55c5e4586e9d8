package idemmysql_test

import (
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest/storetest"
	"github.com/idem-go/idem/store/idemmysql"
)

// BenchmarkHolderBurst: 300 leases heartbeat together and then complete
// together (see [storetest.BenchHolderBurst]), grouped and with statements
// of their own each, side by side on one server.
//
//	go test -run '^$' -bench HolderBurst -benchtime 20x ./store/idemmysql
func BenchmarkHolderBurst(b *testing.B) {
	storetest.BenchHolderBurst(b, func(b *testing.B, grouped bool) idem.Store {
		e := newHolderEnv(b, 0, holderOpts{maxConns: 16})
		if !grouped {
			idemmysql.ExtendAlone(e.s)
			idemmysql.CompleteAlone(e.s)
		}
		return e.s
	})
}
