package idemkafka_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemkafka"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/retry"
	"github.com/idem-go/idem/store/idemsqlite"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

var fast = &retry.Policy{Base: 5 * time.Millisecond, Cap: 20 * time.Millisecond, MaxAttempts: 3}

func suffix() string {
	b := make([]byte, 4)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// env is one test's in-process Kafka cluster, topic and store.
type env struct {
	cluster *kfake.Cluster
	seeds   []string
	topic   string
	store   *idemsqlite.Store
	admin   *kgo.Client
}

func newEnv(t *testing.T, partitions int32) *env {
	t.Helper()
	topic := "orders-" + suffix()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic, topic+".dlq"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	st, err := idemsqlite.Open(context.Background(), "sqlite://"+filepath.Join(t.TempDir(), "idem.db"), &idemsqlite.Config{AutoMigrate: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if _, err := st.DB().Exec(`CREATE TABLE effects (key TEXT NOT NULL, value BLOB NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	e := &env{cluster: c, seeds: c.ListenAddrs(), topic: topic, store: st}
	e.admin = e.client(t)
	return e
}

// client returns a plain client (idempotent producer, franz-go's default).
func (e *env) client(t *testing.T, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(e.seeds...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func (e *env) produce(t *testing.T, cl *kgo.Client, recs ...*kgo.Record) {
	t.Helper()
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// process is a batch function over the SQLite store's ProcessBatch that
// records one effect row per fresh record; fail may fail the batch.
func (e *env) process(fail func(recs []*kgo.Record) error) consume.BatchProcessFunc {
	return func(ctx context.Context, msgs []idem.Message, ds []consume.Delivery) ([]idem.Outcome, error) {
		recs := records(ds)
		if fail != nil {
			if err := fail(recs); err != nil {
				return nil, err
			}
		}
		return e.store.ProcessBatch(ctx, msgs, func(ctx context.Context, tx *sql.Tx, fresh []int) error {
			for _, i := range fresh {
				if _, err := tx.ExecContext(ctx, `INSERT INTO effects (key, value) VALUES (?, ?)`, msgs[i].Key, recs[i].Value); err != nil {
					return err
				}
			}
			return nil
		})
	}
}

func (e *env) effects(t *testing.T) map[string]int {
	t.Helper()
	rows, err := e.store.DB().Query(`SELECT key, count(*) FROM effects GROUP BY key`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	m := map[string]int{}
	for rows.Next() {
		var k string
		var n int
		if err := rows.Scan(&k, &n); err != nil {
			t.Fatal(err)
		}
		m[k] = n
	}
	return m
}

func (e *env) consumer(t *testing.T, cfg idemkafka.Config) *idemkafka.Consumer {
	t.Helper()
	if cfg.Name == "" {
		cfg.Name = "billing"
	}
	if len(cfg.Topics) == 0 {
		cfg.Topics = []string{e.topic}
	}
	if cfg.Retry == nil {
		cfg.Retry = fast
	}
	if cfg.TopicRetention == 0 {
		cfg.TopicRetention = time.Hour
	}
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	cfg.ClientOpts = append([]kgo.Opt{kgo.SeedBrokers(e.seeds...), kgo.FetchMaxWait(100 * time.Millisecond), kgo.HeartbeatInterval(100 * time.Millisecond)}, cfg.ClientOpts...)
	c, err := idemkafka.NewConsumer(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// run starts c and returns a stop function that also runs at cleanup.
func run(t *testing.T, c *idemkafka.Consumer) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := c.Run(ctx); err != nil {
			t.Error(err)
		}
	})
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// committed returns the group's committed offset per partition.
func (e *env) committed(t *testing.T, group string) map[int32]int64 {
	t.Helper()
	return e.committedOn(t, group, e.topic)
}

// committedOn returns the group's committed offset per partition of topic.
func (e *env) committedOn(t *testing.T, group, topic string) map[int32]int64 {
	t.Helper()
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = group
	rt := kmsg.NewOffsetFetchRequestTopic()
	rt.Topic = topic
	rt.Partitions = []int32{0, 1, 2, 3}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(context.Background(), e.admin)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int32]int64{}
	for _, tp := range resp.Topics {
		for _, p := range tp.Partitions {
			if p.Offset >= 0 {
				out[p.Partition] = p.Offset
			}
		}
	}
	return out
}

// readAll consumes every record of topic from the start, without a group.
func (e *env) readAll(t *testing.T, topic string, want int) []*kgo.Record {
	t.Helper()
	cl := e.client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var out []*kgo.Record
	for len(out) < want {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			break
		}
		out = append(out, fs.Records()...)
	}
	return out
}

// records returns the deliveries' Kafka records.
func records(ds []consume.Delivery) []*kgo.Record {
	recs := make([]*kgo.Record, len(ds))
	for i, d := range ds {
		recs[i] = idemkafka.RecordOf(d)
	}
	return recs
}
