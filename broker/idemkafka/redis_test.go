package idemkafka_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemkafka"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/store/idemredis"
	"github.com/redis/rueidis"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestRedisProcessBatch binds the consumer to the Redis store's
// ProcessBatch, as the package docs show, for an effect outside any
// database: every record is produced twice, and each key's effect runs
// once, with every offset committed.
func TestRedisProcessBatch(t *testing.T) {
	t.Parallel()
	opt, err := rueidis.ParseURL(idemtest.ServiceURL(t, "IDEM_REDIS_URL"))
	if err != nil {
		t.Fatal(err)
	}
	client, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	var b [6]byte
	_, _ = rand.Read(b[:])
	prefix := "idemkafka-test:" + hex.EncodeToString(b[:]) + ":"
	store, err := idemredis.New(client, &idemredis.Config{Prefix: prefix, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}

	e := newEnv(t, 4)
	prod := e.client(t, kgo.DefaultProduceTopic(e.topic))
	const n = 200
	for range 2 {
		for i := range n {
			r := idemkafka.NewRecord(e.topic, fmt.Appendf(nil, `{"i":%d}`, i), "m-"+strconv.Itoa(i))
			r.Key = []byte(strconv.Itoa(i))
			e.produce(t, prod, r)
		}
	}
	var (
		mu      sync.Mutex
		effects = map[string]int{}
		hooks   consume.Counters
	)
	c := e.consumer(t, idemkafka.Config{Config: consume.Config{Hooks: []idem.Hook{&hooks}}, MaxPollRecords: 25,
		BatchProcess: func(ctx context.Context, msgs []idem.Message, _ []consume.Delivery) ([]idem.Outcome, error) {
			return store.ProcessBatch(ctx, msgs, func(ctx context.Context, fresh []int) error {
				mu.Lock()
				defer mu.Unlock()
				for _, i := range fresh {
					effects[msgs[i].Key]++ // the effect: outside Redis, e.g. a notification
				}
				return nil
			})
		}})
	run(t, c)
	eventually(t, 30*time.Second, "every record handled and committed", func() bool {
		s := hooks.Snapshot()
		return s.Processed+s.Duplicate == 2*n && sumOffsets(e.committed(t, "billing")) == 2*n
	})
	mu.Lock()
	defer mu.Unlock()
	if len(effects) != n {
		t.Fatalf("%d keys had effects, want %d", len(effects), n)
	}
	for k, v := range effects {
		if v != 1 {
			t.Fatalf("key %s: %d effects, want 1", k, v)
		}
	}
	if s := hooks.Snapshot(); s.Processed != n || s.Duplicate != n {
		t.Fatalf("processed %d, duplicate %d; want %d each", s.Processed, s.Duplicate, n)
	}
	for i := range n {
		if err := store.Delete(context.Background(), "billing", "m-"+strconv.Itoa(i)); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	}
}
