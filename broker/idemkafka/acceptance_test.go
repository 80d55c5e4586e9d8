package idemkafka_test

import (
	"context"
	"fmt"
	"github.com/idem-go/idem"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/idem-go/idem/broker/idemkafka"
	"github.com/idem-go/idem/consume"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Acceptance: 10,000 messages with 30% duplicate publishes (same id
// header, produced again later) flow through a group that rebalances
// three times (members join, one leaves mid-stream) → an exact ledger: 0
// lost, 0 duplicate effects.
func TestAcceptanceTenThousandWithRebalances(t *testing.T) {
	if testing.Short() {
		t.Skip("acceptance run")
	}
	t.Parallel()
	e := newEnv(t, 4)
	prod := e.client(t, kgo.ProducerLinger(0))
	const n = 10000
	rng := rand.New(rand.NewPCG(1, 2))
	var recs []*kgo.Record
	for i := range n {
		r := idemkafka.NewRecord(e.topic, fmt.Appendf(nil, `{"i":%d}`, i), "m-"+strconv.Itoa(i))
		r.Key = []byte(strconv.Itoa(i))
		recs = append(recs, r)
	}
	dups := 0
	for i := range n {
		if rng.IntN(10) < 3 {
			r := idemkafka.NewRecord(e.topic, fmt.Appendf(nil, `{"i":%d}`, i), "m-"+strconv.Itoa(i))
			r.Key = []byte(strconv.Itoa(i))
			recs = append(recs, r)
			dups++
		}
	}
	produced := len(recs)
	produceAll := func(rs []*kgo.Record) {
		if err := prod.ProduceSync(context.Background(), rs...).FirstErr(); err != nil {
			t.Error(err)
		}
	}
	var counters consume.Counters
	slow := func(rs []*kgo.Record) error { time.Sleep(time.Duration(len(rs)) * 100 * time.Microsecond); return nil }
	newMember := func() func() {
		return run(t, e.consumer(t, idemkafka.Config{Config: consume.Config{Hooks: []idem.Hook{&counters}}, BatchProcess: e.process(slow), MaxPollRecords: 100}))
	}
	handled := func() int64 { s := counters.Snapshot(); return s.Processed + s.Duplicate }
	stopA := newMember()
	produceAll(recs[:produced/2])
	eventually(t, 20*time.Second, "a first share", func() bool { return handled() > int64(produced/8) })
	newMember() // rebalance 1
	produceAll(recs[produced/2:])
	eventually(t, 20*time.Second, "a second share", func() bool { return handled() > int64(produced/3) })
	stopA() // rebalance 2: A leaves with work in flight
	newMember()
	eventually(t, 60*time.Second, "the whole stream", func() bool { return sumOffsets(e.committed(t, "billing")) == produced })
	got := e.effects(t)
	if len(got) != n {
		t.Fatalf("%d messages have effects, want %d (lost %d)", len(got), n, n-len(got))
	}
	for k, v := range got {
		if v != 1 {
			t.Fatalf("%s has %d effects", k, v)
		}
	}
	s := counters.Snapshot()
	t.Logf("produced %d (%d duplicates); processed %d, duplicates seen %d", produced, dups, s.Processed, s.Duplicate)
	if s.Processed != n || s.Duplicate < int64(dups) {
		t.Fatalf("counters %+v", s)
	}
}
