package idemkafka_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemkafka"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/retry"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Every message is produced twice with the same id header while a group
// of consumers rebalances twice (a member joins, then the first leaves):
// exactly one effect per message, and the group's offsets end at the end
// of every partition.
func TestRebalanceExactlyOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4)
	prod := e.client(t, kgo.DefaultProduceTopic(e.topic))
	const n = 400
	produced := 0
	for range 2 {
		for i := range n {
			r := idemkafka.NewRecord(e.topic, fmt.Appendf(nil, `{"i":%d}`, i), "m-"+strconv.Itoa(i))
			r.Key = []byte(strconv.Itoa(i)) // spread over the partitions
			e.produce(t, prod, r)
			produced++
		}
	}
	var ca, cb consume.Counters
	slow := func(recs []*kgo.Record) error {
		time.Sleep(time.Duration(len(recs)) * 5 * time.Millisecond)
		return nil
	}
	stopA := run(t, e.consumer(t, idemkafka.Config{Config: consume.Config{Hooks: []idem.Hook{&ca}}, BatchProcess: e.process(slow), MaxPollRecords: 10}))
	handled := func(c *consume.Counters) int64 { s := c.Snapshot(); return s.Processed + s.Duplicate }
	eventually(t, 10*time.Second, "consumer A to be mid-stream", func() bool { return handled(&ca) >= 100 })
	// A second member joins mid-stream: partitions move.
	run(t, e.consumer(t, idemkafka.Config{Config: consume.Config{Hooks: []idem.Hook{&cb}}, BatchProcess: e.process(slow), MaxPollRecords: 10}))
	eventually(t, 20*time.Second, "consumer B to take partitions", func() bool { return handled(&cb) > 0 })
	if handled(&ca)+handled(&cb) >= 2*n {
		t.Fatal("the stream ended before the rebalance; slow the handler down")
	}
	// The first member leaves: B takes everything over.
	stopA()
	eventually(t, 30*time.Second, "every record handled", func() bool {
		got := e.effects(t)
		return len(got) == n && sumOffsets(e.committed(t, "billing")) == produced
	})
	for k, v := range e.effects(t) {
		if v != 1 {
			t.Fatalf("key %s has %d effects", k, v)
		}
	}
	sa, sb := ca.Snapshot(), cb.Snapshot()
	if sa.Processed+sb.Processed != n || sa.Processed == 0 || sb.Processed+sb.Duplicate == 0 {
		t.Fatalf("processed A %+v B %+v", sa, sb)
	}
	if sa.Duplicate+sb.Duplicate < n {
		t.Fatalf("duplicates A %d + B %d < %d", sa.Duplicate, sb.Duplicate, n)
	}
}

func sumOffsets(m map[int32]int64) int {
	s := 0
	for _, o := range m {
		s += int(o)
	}
	return s
}

func header(r *kgo.Record, k string) string {
	for _, h := range r.Headers {
		if h.Key == k {
			return string(h.Value)
		}
	}
	return ""
}

// A record that always fails is retried max_attempts times in process,
// then produced to the dead-letter topic with the failure headers and its
// origin; a permanent error goes there at once; the records around them
// are processed and the offsets move past all of them.
func TestDeadLetterTopic(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	prod := e.client(t)
	var poisonCalls atomic.Int64
	var counters consume.Counters
	c := e.consumer(t, idemkafka.Config{Config: consume.Config{Hooks: []idem.Hook{&counters}}, BatchProcess: e.process(func(recs []*kgo.Record) error {
		for _, r := range recs {
			switch string(r.Value) {
			case "poison":
				poisonCalls.Add(1)
				return errors.New("gateway timeout")
			case "undecodable":
				return retry.Permanent(errors.New("bad json"))
			}
		}
		return nil
	})})
	poison := idemkafka.NewRecord(e.topic, []byte("poison"), "p-1")
	poison.Key = []byte("k")
	poison.Headers = append(poison.Headers, kgo.RecordHeader{Key: "trace", Value: []byte("abc")})
	e.produce(t, prod,
		idemkafka.NewRecord(e.topic, []byte("ok-1"), "ok-1"),
		poison,
		idemkafka.NewRecord(e.topic, []byte("undecodable"), "u-1"),
		&kgo.Record{Topic: e.topic, Value: []byte("no id")}, // keyed by offset
	)
	run(t, c)
	dl := e.readAll(t, e.topic+".dlq", 2)
	if len(dl) != 2 {
		t.Fatalf("%d dead letters", len(dl))
	}
	p := dl[0]
	get := func(k string) (string, bool) { v := header(p, k); return v, v != "" }
	meta := consume.ParseDeadLetter(get)
	if string(p.Value) != "poison" || string(p.Key) != "k" || meta.Attempts != 3 || meta.Reason != idem.DeadMaxAttempts ||
		meta.Consumer != "billing" || meta.Origin != e.topic || !strings.Contains(meta.LastError, "gateway timeout") || meta.FirstFailure.IsZero() {
		t.Fatalf("dead letter %q %+v", p.Value, meta)
	}
	if header(p, idemkafka.HeaderTopic) != e.topic || header(p, idemkafka.HeaderPartition) != "0" || header(p, idemkafka.HeaderOffset) != "1" ||
		header(p, "trace") != "abc" || header(p, idemkafka.DefaultIDHeader) != "p-1" {
		t.Fatalf("headers %v", p.Headers)
	}
	if string(dl[1].Value) != "undecodable" || header(dl[1], consume.HeaderReason) != string(idem.DeadPermanent) || header(dl[1], idemkafka.HeaderOffset) != "2" {
		t.Fatalf("second dead letter %q %v", dl[1].Value, dl[1].Headers)
	}
	// One batch call, then max_attempts single calls.
	if n := poisonCalls.Load(); n != 4 {
		t.Fatalf("poison handled %d times, want 1 batch + 3 attempts", n)
	}
	eventually(t, 5*time.Second, "offsets past the dead letters", func() bool { return e.committed(t, "billing")[0] == 4 })
	got := e.effects(t)
	if len(got) != 2 || got["ok-1"] != 1 || got[e.topic+"-0-3"] != 1 {
		t.Fatalf("effects %v", got)
	}
	if s := counters.Snapshot(); s.DeadLettered != 2 || s.Retried != 2 || s.Processed != 2 {
		t.Fatalf("counters %+v", s)
	}
}

// An abandoned batch commits only the contiguous prefix that committed:
// the next owner starts at the first unsettled record and the earlier
// ones are not read again.
func TestCommitsContiguousPrefixOnly(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	prod := e.client(t)
	for i := range 6 {
		e.produce(t, prod, idemkafka.NewRecord(e.topic, []byte("v"+strconv.Itoa(i)), "id-"+strconv.Itoa(i)))
	}
	stuck := make(chan struct{})
	var seen atomic.Int64
	a := e.consumer(t, idemkafka.Config{Config: consume.Config{Retry: &retry.Policy{Base: time.Hour, Cap: time.Hour, MaxAttempts: 5}}, BatchProcess: e.process(func(recs []*kgo.Record) error {
		for _, r := range recs {
			if string(r.Value) == "v3" {
				// A transient failure that keeps the record unsettled.
				seen.Add(1)
				select {
				case <-stuck:
				default:
					close(stuck)
				}
				return errors.New("flaky")
			}
		}
		return nil
	})})
	stopA := run(t, a)
	<-stuck
	eventually(t, 5*time.Second, "the prefix's effects", func() bool { return len(e.effects(t)) == 3 })
	stopA()
	if got := e.committed(t, "billing")[0]; got != 3 {
		t.Fatalf("committed %d, want 3 (the offset of the unsettled record)", got)
	}
	var firstOffset atomic.Int64
	firstOffset.Store(-1)
	b := e.consumer(t, idemkafka.Config{BatchProcess: func(ctx context.Context, msgs []idem.Message, ds []consume.Delivery) ([]idem.Outcome, error) {
		firstOffset.CompareAndSwap(-1, idemkafka.RecordOf(ds[0]).Offset)
		return e.process(nil)(ctx, msgs, ds)
	}})
	run(t, b)
	eventually(t, 10*time.Second, "the rest", func() bool { return len(e.effects(t)) == 6 })
	if f := firstOffset.Load(); f != 3 {
		t.Fatalf("the new owner started at %d, want 3", f)
	}
}

func TestMissingIDPolicies(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	prod := e.client(t)
	e.produce(t, prod, &kgo.Record{Topic: e.topic, Value: []byte("same")}, &kgo.Record{Topic: e.topic, Value: []byte("same")})
	content := e.consumer(t, idemkafka.Config{Config: consume.Config{Name: "content", MissingID: consume.ContentKey}, NoOffsetKey: true, BatchProcess: e.process(nil)})
	run(t, content)
	eventually(t, 5*time.Second, "content-keyed effect", func() bool { return e.effects(t)[idem.ContentID([]byte("same"))] == 1 })
	dlc := e.consumer(t, idemkafka.Config{Config: consume.Config{Name: "strict"}, NoOffsetKey: true, BatchProcess: e.process(nil), DeadLetterTopic: e.topic + ".dlq"})
	run(t, dlc)
	dl := e.readAll(t, e.topic+".dlq", 2)
	if len(dl) != 2 || header(dl[0], consume.HeaderReason) != string(idem.DeadMissingID) {
		t.Fatalf("dead letters %v", dl)
	}
	time.Sleep(200 * time.Millisecond)
	if len(e.effects(t)) != 1 {
		t.Fatalf("effects %v", e.effects(t))
	}
}

// The same id with a different payload is an id conflict: dead-lettered,
// never applied.
func TestIDConflict(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	prod := e.client(t)
	e.produce(t, prod, idemkafka.NewRecord(e.topic, []byte("a"), "x"), idemkafka.NewRecord(e.topic, []byte("b"), "x"))
	run(t, e.consumer(t, idemkafka.Config{BatchProcess: e.process(nil)}))
	dl := e.readAll(t, e.topic+".dlq", 1)
	if len(dl) != 1 || string(dl[0].Value) != "b" || header(dl[0], consume.HeaderReason) != string(idem.DeadMismatch) {
		t.Fatalf("dead letters %v", dl)
	}
	if got := e.effects(t); got["x"] != 1 {
		t.Fatalf("effects %v", got)
	}
}

// Store outages are retried without counting toward max_attempts; a
// panicking handler is a counted failure; a batch function returning the
// wrong number of results is an error.
func TestInfrastructureErrorsAndPanics(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	prod := e.client(t)
	e.produce(t, prod, idemkafka.NewRecord(e.topic, []byte("a"), "a"), idemkafka.NewRecord(e.topic, []byte("boom"), "b"))
	var outages atomic.Int64
	c := e.consumer(t, idemkafka.Config{BatchProcess: e.process(func(recs []*kgo.Record) error {
		if outages.Add(1) <= 5 {
			return idem.Retryable(errors.New("connection refused"))
		}
		for _, r := range recs {
			if string(r.Value) == "boom" {
				panic("poison")
			}
		}
		return nil
	})})
	run(t, c)
	dl := e.readAll(t, e.topic+".dlq", 1)
	if len(dl) != 1 || string(dl[0].Value) != "boom" || header(dl[0], consume.HeaderAttempts) != "3" || !strings.Contains(header(dl[0], consume.HeaderLastError), "panicked") {
		t.Fatalf("dead letters %v", dl)
	}
	if got := e.effects(t); got["a"] != 1 || len(got) != 1 {
		t.Fatalf("effects %v", got)
	}

	e2 := newEnv(t, 1)
	e2.produce(t, e2.client(t), idemkafka.NewRecord(e2.topic, []byte("a"), "a"))
	bad := e2.consumer(t, idemkafka.Config{BatchProcess: func(context.Context, []idem.Message, []consume.Delivery) ([]idem.Outcome, error) {
		return nil, nil
	}})
	run(t, bad)
	dl = e2.readAll(t, e2.topic+".dlq", 1)
	if len(dl) != 1 || !strings.Contains(header(dl[0], consume.HeaderLastError), "0 results for 1 messages") {
		t.Fatalf("dead letters %v", dl)
	}
}

func createTopic(t *testing.T, e *env, name, retentionMS string) {
	t.Helper()
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = name, 1, 1
	c := kmsg.NewCreateTopicsRequestTopicConfig()
	c.Name, c.Value = "retention.ms", &retentionMS
	rt.Configs = append(rt.Configs, c)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(context.Background(), e.client(t))
	if err != nil || resp.Topics[0].ErrorCode != 0 {
		t.Fatalf("create topic: %v %+v", err, resp)
	}
}

func TestRetentionCheck(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	createTopic(t, e, "hour", "3600000")
	createTopic(t, e, "forever", "-1")
	try := func(cfg idemkafka.Config) error {
		cfg.Name = "billing"
		cfg.BatchProcess = e.process(nil)
		cfg.Logger = quiet
		cfg.ClientOpts = []kgo.Opt{kgo.SeedBrokers(e.seeds...)}
		c, err := idemkafka.NewConsumer(&cfg)
		if err != nil {
			return err
		}
		return c.Ping(context.Background()) // reads the topics' retention
	}
	err := try(idemkafka.Config{Config: consume.Config{Retention: 30 * time.Minute}, Topics: []string{"hour"}})
	if !errors.Is(err, idem.ErrInvalidConfig) || !strings.Contains(err.Error(), "30m0s") || !strings.Contains(err.Error(), "1h0m0s") || !strings.Contains(err.Error(), `topic "hour" retention.ms`) {
		t.Fatalf("read retention: %v", err)
	}
	if err := try(idemkafka.Config{Config: consume.Config{Retention: 2 * time.Hour}, Topics: []string{"hour"}}); err != nil {
		t.Fatal(err)
	}
	err = try(idemkafka.Config{Topics: []string{"forever"}})
	if !errors.Is(err, idem.ErrInvalidConfig) || !strings.Contains(err.Error(), "retention.ms -1") {
		t.Fatalf("infinite retention: %v", err)
	}
	if err := try(idemkafka.Config{Topics: []string{"forever"}, TopicRetention: 12 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	err = try(idemkafka.Config{Config: consume.Config{Retention: time.Hour, Retry: &retry.Policy{MaxAttempts: 10, Cap: 10 * time.Minute}}, Topics: []string{"hour"}, TopicRetention: -1})
	if !errors.Is(err, idem.ErrInvalidConfig) || !strings.Contains(err.Error(), "1h40m0s") || !strings.Contains(err.Error(), "max_attempts 10") {
		t.Fatalf("backoff horizon: %v", err)
	}
	if _, err := idemkafka.NewConsumer(nil); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatal(err)
	}
	if err := try(idemkafka.Config{Config: consume.Config{Retention: 2 * time.Hour}, Topics: []string{"hour"}, ClientOpts: nil}); err != nil {
		t.Fatal(err)
	}
	cfg := idemkafka.Config{Topics: []string{"hour"}, BatchProcess: e.process(nil)}
	if _, err := idemkafka.NewConsumer(&cfg); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("no name: %v", err)
	}
}

func TestNewRecord(t *testing.T) {
	t.Parallel()
	r := idemkafka.NewRecord("t", []byte("v"), "")
	if header(r, idemkafka.DefaultIDHeader) != idem.ContentID([]byte("v")) || r.Topic != "t" {
		t.Fatalf("%+v", r)
	}
	if header(idemkafka.NewRecord("t", []byte("v"), "id-1"), idemkafka.DefaultIDHeader) != "id-1" {
		t.Fatal("caller's id not used")
	}
}

// NewConsumer does no I/O: a dead address is found by Ping (and Run),
// with an error that says so; a live cluster pings.
func TestPing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	cfg := idemkafka.Config{Config: consume.Config{Name: "billing", Logger: quiet}, Topics: []string{e.topic},
		BatchProcess: e.process(nil), ClientOpts: []kgo.Opt{kgo.SeedBrokers(e.seeds...)}, TopicRetention: time.Hour}
	c, err := idemkafka.NewConsumer(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(t.Context()); err != nil {
		t.Fatal(err)
	}
	cfg.ClientOpts = []kgo.Opt{kgo.SeedBrokers("127.0.0.1:1")}
	dead, err := idemkafka.NewConsumer(&cfg)
	if err != nil {
		t.Fatalf("NewConsumer dialled: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	if err := dead.Ping(ctx); err == nil || !strings.Contains(err.Error(), "cannot reach the cluster") {
		t.Fatalf("Ping of a dead address: %v", err)
	}
	cfg.TopicRetention = 0 // Run checks the retention first
	dead, _ = idemkafka.NewConsumer(&cfg)
	if err := dead.Run(t.Context()); err == nil || !strings.Contains(err.Error(), "cannot reach the cluster") {
		t.Fatalf("Run against a dead address: %v", err)
	}
}

// The content id is idem.ContentID: the hex SHA-256 of the value.
func TestContentIDVector(t *testing.T) {
	t.Parallel()
	r := idemkafka.NewRecord("t", []byte("abc"), "")
	if got := header(r, idemkafka.DefaultIDHeader); got != "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" {
		t.Fatalf("content id %s", got)
	}
}
