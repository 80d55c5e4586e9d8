package idemkafka_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem/broker/idemkafka"
	"github.com/idem-go/idem/consume"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A poison record read again before its offset was committed (here: by a
// second group under the same consumer name, which starts from the
// beginning, as a restart after a crash does) is dead-lettered a second
// time with the same dead-letter id and original id; a reader of the
// dead-letter topic that dedupes on the dead-letter id sees it once.
func TestDeadLetterReReadSameID(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	prod := e.client(t)
	fail := e.process(func(recs []*kgo.Record) error {
		for _, r := range recs {
			if string(r.Value) == "poison" {
				return errors.New("gateway timeout")
			}
		}
		return nil
	})
	e.produce(t, prod, idemkafka.NewRecord(e.topic, []byte("ok-1"), "ok-1"), idemkafka.NewRecord(e.topic, []byte("poison"), "p-1"))
	stop := run(t, e.consumer(t, idemkafka.Config{BatchProcess: fail}))
	if dl := e.readAll(t, e.topic+".dlq", 1); len(dl) != 1 {
		t.Fatalf("%d dead letters after the first read", len(dl))
	}
	stop()
	run(t, e.consumer(t, idemkafka.Config{Group: "billing-reread", BatchProcess: fail}))
	dl := e.readAll(t, e.topic+".dlq", 2)
	if len(dl) != 2 {
		t.Fatalf("%d dead letters after the re-read", len(dl))
	}
	want := idemkafka.DeadLetterID(e.topic, 0, 1)
	for _, r := range dl {
		if header(r, consume.HeaderDeadLetterID) != want || header(r, consume.HeaderOriginalID) != "p-1" || string(r.Value) != "poison" {
			t.Fatalf("dead letter %q %v, want dead-letter id %q", r.Value, r.Headers, want)
		}
	}
	if got := e.effects(t); len(got) != 1 || got["ok-1"] != 1 {
		t.Fatalf("effects %v", got)
	}

	// A consumer of the dead-letter topic keyed by the dead-letter id
	// handles the two copies once.
	run(t, e.consumer(t, idemkafka.Config{Config: consume.Config{Name: "dlq-reader"}, Topics: []string{e.topic + ".dlq"},
		IDHeader: consume.HeaderDeadLetterID, BatchProcess: e.process(nil)}))
	eventually(t, 10*time.Second, "both dead letters read", func() bool { return e.committedOn(t, "dlq-reader", e.topic+".dlq")[0] == 2 })
	if got := e.effects(t); len(got) != 2 || got[want] != 1 {
		t.Fatalf("effects %v", got)
	}
}
