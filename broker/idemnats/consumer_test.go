package idemnats_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemnats"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/retry"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

var fast = &retry.Policy{Base: 20 * time.Millisecond, Cap: 100 * time.Millisecond, MaxAttempts: 3}

func newConsumer(t *testing.T, e *env, durable string, cfg idemnats.Config) *idemnats.Consumer {
	t.Helper()
	cfg.Stream, cfg.Consumer, cfg.DeadLetterSubject = e.stream, durable, e.dlq
	if cfg.Name == "" {
		cfg.Name = "orders"
	}
	if cfg.Retry == nil {
		cfg.Retry = fast
	}
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	c, err := idemnats.NewConsumer(e.js, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func streamMsgs(t *testing.T, e *env, name string) uint64 {
	t.Helper()
	s, err := e.js.Stream(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return s.CachedInfo().State.Msgs
}

// The third exercise on the real server: content-hash ids over a short
// duplicate window.
func TestThirdExercise(t *testing.T) {
	t.Parallel()
	const window = 2 * time.Second
	e := newEnv(t, window)
	ctx := context.Background()
	e.consumer(t, "c", 5*time.Second, -1)
	var deliveries atomic.Int64
	c := newConsumer(t, e, "c", idemnats.Config{Process: e.process(func(consume.Delivery) error {
		deliveries.Add(1)
		return nil
	})})
	pub := idemnats.NewPublisher(e.js)
	order := []byte(`{"order":42,"qty":1}`)

	start := time.Now()
	var dups int
	for i := range 10 {
		r, err := pub.Publish(ctx, e.subject, order, "")
		if err != nil {
			t.Fatal(err)
		}
		if r.ID != idem.ContentID(order) || r.Sequence != 1 {
			t.Fatalf("publish %d: %+v", i, r)
		}
		if r.Duplicate {
			dups++
		}
	}
	if time.Since(start) > window {
		t.Fatal("publishing took longer than the window; the test is meaningless")
	}
	if dups != 9 || streamMsgs(t, e, e.stream) != 1 {
		t.Fatalf("10 identical publishes: %d duplicates, %d stored; want 9 and 1", dups, streamMsgs(t, e, e.stream))
	}
	run(t, c)
	eventually(t, 5*time.Second, "1 delivery", func() bool { return deliveries.Load() == 1 })
	time.Sleep(200 * time.Millisecond)
	if n := deliveries.Load(); n != 1 {
		t.Fatalf("%d deliveries, want 1", n)
	}

	// After the window the stream accepts the same content again; idem's
	// own dedupe (24h) still keeps it to one effect.
	time.Sleep(window + 500*time.Millisecond)
	r, err := pub.Publish(ctx, e.subject, order, "")
	if err != nil || r.Duplicate || r.Sequence != 2 {
		t.Fatalf("after the window: %+v %v", r, err)
	}
	// One changed field: a new message.
	changed := []byte(`{"order":42,"qty":2}`)
	r, err = pub.Publish(ctx, e.subject, changed, "")
	if err != nil || r.Duplicate || r.Sequence != 3 {
		t.Fatalf("changed field: %+v %v", r, err)
	}
	eventually(t, 5*time.Second, "the changed message's effect", func() bool { return len(e.effects(t)) == 2 })
	got := e.effects(t)
	if got[idem.ContentID(order)] != 1 || got[idem.ContentID(changed)] != 1 {
		t.Fatalf("effects %v", got)
	}
	if n := streamMsgs(t, e, e.stream); n != 3 {
		t.Fatalf("stream holds %d, want 3", n)
	}
	// The re-accepted copy was delivered but processed as a duplicate.
	eventually(t, 5*time.Second, "3 handler-visible deliveries", func() bool { return deliveries.Load() == 2 })
}

// A duplicate storm: every message reaches three durable consumers (each
// served by two consumer instances of eight goroutines) that share one idem
// name, and every publish is retried by the producer → one effect per
// message.
func TestDuplicateStormAcrossConsumers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Minute)
	ctx := context.Background()
	var counters consume.Counters
	for i := range 3 {
		name := fmt.Sprintf("c%d", i)
		e.consumer(t, name, 5*time.Second, -1)
		// Two processes per durable consumer.
		for range 2 {
			run(t, newConsumer(t, e, name, idemnats.Config{Config: consume.Config{Hooks: []idem.Hook{&counters}}, Process: e.process(nil), Concurrency: 8}))
		}
	}
	pub := idemnats.NewPublisher(e.js)
	const n = 100
	for i := range n {
		body := fmt.Appendf(nil, `{"i":%d}`, i)
		for range 3 { // producer retries: the stream drops them
			if _, err := pub.Publish(ctx, e.subject, body, fmt.Sprintf("m-%d", i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	eventually(t, 45*time.Second, "every delivery", func() bool {
		s := counters.Snapshot()
		return s.Processed+s.Duplicate == 3*n
	})
	got := e.effects(t)
	if len(got) != n {
		t.Fatalf("%d keys with effects, want %d", len(got), n)
	}
	for k, v := range got {
		if v != 1 {
			t.Fatalf("key %s has %d effects", k, v)
		}
	}
	if s := counters.Snapshot(); s.Processed != n || s.Duplicate != 2*n {
		t.Fatalf("counters %+v", s)
	}
}

// readDLQ returns the dead letters published so far.
func readDLQ(t *testing.T, e *env, want int) []jetstream.Msg {
	t.Helper()
	ctx := context.Background()
	cons, err := e.js.CreateOrUpdateConsumer(ctx, e.stream+"_DLQ", jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(want+1, jetstream.FetchMaxWait(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var out []jetstream.Msg
	for m := range batch.Messages() {
		out = append(out, m)
	}
	return out
}

func TestHandlerFailureRetriesThenDeadLetter(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Minute)
	ctx := context.Background()
	e.consumer(t, "c", 5*time.Second, -1)
	var calls atomic.Int64
	var counters consume.Counters
	c := newConsumer(t, e, "c", idemnats.Config{Config: consume.Config{Hooks: []idem.Hook{&counters}}, Process: e.process(func(consume.Delivery) error {
		calls.Add(1)
		return errors.New("gateway timeout")
	})})
	m := nats.NewMsg(e.subject)
	m.Data = []byte(`{"order":7}`)
	m.Header.Set("trace", "abc")
	if _, err := idemnats.NewPublisher(e.js).PublishMsg(ctx, m, "order-7"); err != nil {
		t.Fatal(err)
	}
	run(t, c)
	eventually(t, 10*time.Second, "a dead letter", func() bool { return streamMsgs(t, e, e.stream+"_DLQ") == 1 })
	if n := calls.Load(); n != 3 {
		t.Fatalf("handler ran %d times, want max_attempts 3", n)
	}
	dl := readDLQ(t, e, 1)
	if len(dl) != 1 {
		t.Fatalf("%d dead letters", len(dl))
	}
	h := dl[0].Headers()
	meta := consume.ParseDeadLetter(func(k string) (string, bool) { v := h.Get(k); return v, v != "" })
	if meta.Attempts != 3 || meta.Reason != idem.DeadMaxAttempts || meta.Consumer != "orders" || meta.Origin != e.subject ||
		!strings.Contains(meta.LastError, "gateway timeout") || meta.FirstFailure.IsZero() || !meta.LastFailure.After(meta.FirstFailure) {
		t.Fatalf("dead-letter metadata %+v", meta)
	}
	if h.Get("trace") != "abc" || h.Get(idemnats.HeaderStream) != e.stream || h.Get(idemnats.HeaderStreamSeq) != "1" || h.Get(idemnats.HeaderDeliveries) != "3" {
		t.Fatalf("headers %v", h)
	}
	// The original id keeps its own header; Nats-Msg-Id is the dead
	// letter's own id, for the dead-letter stream's dedupe.
	if meta.OriginalID != "order-7" || meta.DeadLetterID != idemnats.DeadLetterID(e.stream, 1) || h.Get(jetstream.MsgIDHeader) != meta.DeadLetterID {
		t.Fatalf("ids: %+v, Nats-Msg-Id %q", meta, h.Get(jetstream.MsgIDHeader))
	}
	if string(dl[0].Data()) != `{"order":7}` {
		t.Fatalf("body %q", dl[0].Data())
	}
	// The original was terminated: nothing pending, nothing redelivered.
	time.Sleep(300 * time.Millisecond)
	info, err := e.js.Consumer(ctx, e.stream, "c")
	if err != nil {
		t.Fatal(err)
	}
	if ci := info.CachedInfo(); ci.NumAckPending != 0 || ci.NumPending != 0 || calls.Load() != 3 {
		t.Fatalf("after term: %+v, calls %d", ci, calls.Load())
	}
	if s := counters.Snapshot(); s.Retried != 2 || s.DeadLettered != 1 || s.Processed != 0 {
		t.Fatalf("counters %+v", s)
	}
	if len(e.effects(t)) != 0 {
		t.Fatal("a failed handler left an effect")
	}
}

// Two consumer processes (separate connections) share one durable; the
// redeliveries of poison messages land on either. Every dead letter says
// max_attempts attempts, the server's delivery count, and a first failure
// before the last; no message is tried more than max_attempts times.
func TestRetryStateAcrossProcesses(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Minute)
	ctx := context.Background()
	e.consumer(t, "shared", 5*time.Second, -1)
	const n = 12
	var mu sync.Mutex
	handledBy := map[string][]int{}
	for i := range 2 {
		_, js := connect(t)
		cfg := idemnats.Config{Config: consume.Config{Name: "orders", Retry: fast, Logger: quiet}, Stream: e.stream, Consumer: "shared",
			DeadLetterSubject: e.dlq, Concurrency: 2, Process: e.process(func(d consume.Delivery) error {
				mu.Lock()
				handledBy[d.ID()] = append(handledBy[d.ID()], i)
				mu.Unlock()
				return errors.New("gateway timeout")
			})}
		c, err := idemnats.NewConsumer(js, &cfg)
		if err != nil {
			t.Fatal(err)
		}
		run(t, c)
	}
	pub := idemnats.NewPublisher(e.js)
	for i := range n {
		if _, err := pub.Publish(ctx, e.subject, []byte("poison"), fmt.Sprintf("p-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 20*time.Second, "every dead letter", func() bool { return streamMsgs(t, e, e.stream+"_DLQ") == n })
	for _, m := range readDLQ(t, e, n) {
		h := m.Headers()
		meta := consume.ParseDeadLetter(func(k string) (string, bool) { v := h.Get(k); return v, v != "" })
		if meta.Attempts != 3 || h.Get(idemnats.HeaderDeliveries) != "3" || meta.FirstFailure.IsZero() || !meta.FirstFailure.Before(meta.LastFailure) {
			t.Errorf("dead letter of %s (handled by %v): %+v, deliveries %s", meta.OriginalID, handledBy[meta.OriginalID], meta, h.Get(idemnats.HeaderDeliveries))
		}
	}
	mu.Lock()
	defer mu.Unlock()
	crossed := 0
	for id, by := range handledBy {
		if len(by) != 3 {
			t.Errorf("%s handled %d times (by %v), want max_attempts 3", id, len(by), by)
		}
		if slices.Contains(by, 0) && slices.Contains(by, 1) {
			crossed++
		}
	}
	t.Logf("%d of %d messages were handled by both processes", crossed, n)
}

func TestMissingIDAndPermanent(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Minute)
	ctx := context.Background()
	e.consumer(t, "c", 5*time.Second, -1)
	c := newConsumer(t, e, "c", idemnats.Config{Process: e.process(func(d consume.Delivery) error {
		if string(d.Body()) == "bad" {
			return retry.Permanent(errors.New("undecodable"))
		}
		return nil
	})})
	if _, err := e.js.Publish(ctx, e.subject, []byte("no id")); err != nil {
		t.Fatal(err)
	}
	if _, err := idemnats.NewPublisher(e.js).Publish(ctx, e.subject, []byte("bad"), "bad-1"); err != nil {
		t.Fatal(err)
	}
	run(t, c)
	eventually(t, 10*time.Second, "two dead letters", func() bool { return streamMsgs(t, e, e.stream+"_DLQ") == 2 })
	reasons := map[string]idem.DeadReason{}
	for _, m := range readDLQ(t, e, 2) {
		reasons[string(m.Data())] = idem.DeadReason(m.Headers().Get(consume.HeaderReason))
	}
	if reasons["no id"] != idem.DeadMissingID || reasons["bad"] != idem.DeadPermanent {
		t.Fatalf("reasons %v", reasons)
	}
}

// A handler slower than AckWait keeps its delivery through InProgress
// heartbeats: the server does not redeliver it meanwhile.
func TestHeartbeatKeepsSlowHandler(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Minute)
	ctx := context.Background()
	e.consumer(t, "c", time.Second, -1)
	var calls atomic.Int64
	c := newConsumer(t, e, "c", idemnats.Config{Concurrency: 2, Process: e.process(func(consume.Delivery) error {
		calls.Add(1)
		time.Sleep(2500 * time.Millisecond)
		return nil
	})})
	if _, err := idemnats.NewPublisher(e.js).Publish(ctx, e.subject, []byte("slow"), "slow-1"); err != nil {
		t.Fatal(err)
	}
	run(t, c)
	eventually(t, 10*time.Second, "the effect", func() bool { return len(e.effects(t)) == 1 })
	if n := calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times: AckWait expired under it", n)
	}
}

func TestDoubleAck(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Minute)
	ctx := context.Background()
	e.consumer(t, "c", 5*time.Second, -1)
	var counters consume.Counters
	c := newConsumer(t, e, "c", idemnats.Config{Config: consume.Config{Hooks: []idem.Hook{&counters}}, DoubleAck: true, Process: e.process(nil)})
	if _, err := idemnats.NewPublisher(e.js).Publish(ctx, e.subject, []byte("x"), "x-1"); err != nil {
		t.Fatal(err)
	}
	run(t, c)
	eventually(t, 5*time.Second, "the ack", func() bool { return counters.Snapshot().Processed == 1 })
	info, err := e.js.Consumer(ctx, e.stream, "c")
	if err != nil {
		t.Fatal(err)
	}
	if ci := info.CachedInfo(); ci.NumAckPending != 0 || ci.AckFloor.Stream != 1 {
		t.Fatalf("ack not confirmed: %+v", ci)
	}
}

func TestStartupChecks(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2*time.Minute)
	ctx := context.Background()
	e.consumer(t, "long", time.Minute, 10)
	e.consumer(t, "few", time.Second, 2)
	if _, err := e.js.CreateOrUpdateConsumer(ctx, e.stream, jetstream.ConsumerConfig{Durable: "none", AckPolicy: jetstream.AckNonePolicy}); err != nil {
		t.Fatal(err)
	}
	shortDLQ := "idemtest." + suffix() + ".dlq"
	if _, err := e.js.CreateStream(ctx, jetstream.StreamConfig{Name: e.stream + "_SHORTDLQ", Subjects: []string{shortDLQ}, Duplicates: time.Second, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.js.DeleteStream(context.Background(), e.stream+"_SHORTDLQ") })
	base := idemnats.Config{Config: consume.Config{Name: "orders", Retry: fast, Logger: quiet}, Stream: e.stream, DeadLetterSubject: e.dlq, Process: e.process(nil)}
	try := func(mod func(*idemnats.Config)) error {
		cfg := base
		mod(&cfg)
		c, err := idemnats.NewConsumer(e.js, &cfg)
		if err != nil {
			return err
		}
		return c.Ping(ctx)
	}
	cases := []struct {
		name string
		mod  func(*idemnats.Config)
		want []string
	}{
		// AckWait 1m × MaxDeliver 10 = 10m > retention 5m.
		{"ack wait × max deliver", func(c *idemnats.Config) { c.Consumer = "long"; c.Retention = 5 * time.Minute }, []string{"5m0s", "10m0s", "AckWait 1m0s × MaxDeliver 10"}},
		// Stream duplicate window 2m > retention 90s (consumer horizon 2s).
		{"duplicate window", func(c *idemnats.Config) {
			c.Consumer = "few"
			c.Retry = &retry.Policy{MaxAttempts: 2, Cap: time.Second}
			c.Retention = 90 * time.Second
		}, []string{"1m30s", "2m0s", "duplicate window"}},
		// max_attempts × max_backoff = 3 × 1h.
		{"backoff", func(c *idemnats.Config) {
			c.Consumer = "long"
			c.Retry = &retry.Policy{MaxAttempts: 3, Cap: time.Hour}
			c.Retention = 2 * time.Hour
		}, []string{"2h0m0s", "3h0m0s"}},
		{"max deliver below attempts", func(c *idemnats.Config) { c.Consumer = "few" }, []string{"MaxDeliver 2", "max_attempts 3"}},
		{"ack none", func(c *idemnats.Config) { c.Consumer = "none" }, []string{"explicit acks"}},
		{"dlq not captured", func(c *idemnats.Config) { c.Consumer = "long"; c.DeadLetterSubject = "nowhere." + suffix() }, []string{"dead-letter subject"}},
		{"no dlq", func(c *idemnats.Config) { c.Consumer = "long"; c.DeadLetterSubject = "" }, []string{"DeadLetterSubject"}},
		// The dead-letter stream forgets a dead letter's id after 1s; the
		// original comes back after AckWait 1m.
		{"dlq duplicate window", func(c *idemnats.Config) { c.Consumer = "long"; c.DeadLetterSubject = shortDLQ }, []string{"duplicate window of 1s", "AckWait 1m0s"}},
		{"no consumer", func(c *idemnats.Config) { c.Consumer = "" }, []string{"Stream and Consumer"}},
		{"no name", func(c *idemnats.Config) { c.Consumer = "long"; c.Name = "" }, []string{"name"}},
	}
	for _, tc := range cases {
		err := try(tc.mod)
		if !errors.Is(err, idem.ErrInvalidConfig) {
			t.Fatalf("%s: %v", tc.name, err)
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Fatalf("%s: %q lacks %q", tc.name, err, w)
			}
		}
	}
	if err := try(func(c *idemnats.Config) { c.Consumer = "missing" }); err == nil || errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("missing consumer: %v", err)
	}
	if err := try(func(c *idemnats.Config) { c.Stream = "NOPE_" + suffix(); c.Consumer = "long" }); err == nil {
		t.Fatal("missing stream accepted")
	}
	if _, err := idemnats.NewConsumer(nil, nil); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatal(err)
	}
	if err := try(func(c *idemnats.Config) { c.Consumer = "long" }); err != nil {
		t.Fatalf("valid config: %v", err)
	}
}

func TestPublisherErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Minute)
	pub := idemnats.NewPublisher(e.js)
	if _, err := pub.PublishMsg(context.Background(), nil, ""); err == nil {
		t.Fatal("nil message accepted")
	}
	r, err := pub.Publish(context.Background(), "nowhere."+suffix(), []byte("x"), "")
	// The content id is idem.ContentID, the hex SHA-256: a known vector.
	if err == nil || r.ID != "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881" {
		t.Fatalf("publish to no stream: %+v %v", r, err)
	}
}

// NewConsumer does no I/O; Ping (and Run) find a server that is gone, with
// an error naming what they looked for.
func TestPing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Minute)
	e.consumer(t, "c", time.Minute, -1)
	cfg := idemnats.Config{Config: consume.Config{Name: "orders", Retry: fast, Logger: quiet},
		Stream: e.stream, Consumer: "c", DeadLetterSubject: e.dlq, Process: e.process(nil)}
	c, err := idemnats.NewConsumer(e.js, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(t.Context()); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(natsURL(t))
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	nc.Close()
	gone, err := idemnats.NewConsumer(js, &cfg)
	if err != nil {
		t.Fatalf("NewConsumer talked to the server: %v", err)
	}
	if err := gone.Ping(t.Context()); err == nil || !strings.Contains(err.Error(), `stream "`+e.stream+`"`) {
		t.Fatalf("Ping over a closed connection: %v", err)
	}
	if err := gone.Run(t.Context()); err == nil || !strings.Contains(err.Error(), `stream "`+e.stream+`"`) {
		t.Fatalf("Run over a closed connection: %v", err)
	}
}
