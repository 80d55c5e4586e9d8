package idemnats

import (
	"context"
	"crypto/rand"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/retry"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// fakeMsg is the delivered-th delivery of the message at stream sequence
// 7; it records naks.
type fakeMsg struct {
	jetstream.Msg
	delivered uint64
	stored    time.Time
	naks      int
}

func (m *fakeMsg) Headers() nats.Header {
	return nats.Header{jetstream.MsgIDHeader: []string{"order-7"}}
}
func (m *fakeMsg) Data() []byte                     { return []byte("x") }
func (m *fakeMsg) Subject() string                  { return "orders" }
func (m *fakeMsg) NakWithDelay(time.Duration) error { m.naks++; return nil }
func (m *fakeMsg) Nak() error                       { m.naks++; return nil }

func (m *fakeMsg) delivery(c *Consumer) *delivery {
	return &delivery{c: c, m: m, md: &jetstream.MsgMetadata{
		Sequence: jetstream.SequencePair{Stream: 7}, NumDelivered: m.delivered, Stream: "S", Timestamp: m.stored}}
}

func testConsumer(t *testing.T) *Consumer {
	t.Helper()
	c, err := NewConsumer(fakeJS{}, &Config{Config: consume.Config{Name: "orders", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Retry: &retry.Policy{Base: time.Millisecond, Cap: time.Millisecond, MaxAttempts: 3}},
		Stream: "S", Consumer: "c", DeadLetterSubject: "dlq", Process: func(context.Context, idem.Message, consume.Delivery) (idem.Outcome, error) {
			return "", errors.New("boom")
		}})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

type fakeJS struct{ jetstream.JetStream }

// Deliveries of one message alternate between two processes, A, B, A: the
// state each sees counts the deliveries the other had as failed attempts,
// and keeps its own failure times; a process that did not see the first
// failure starts it at the message's stream timestamp.
func TestStateAcrossProcesses(t *testing.T) {
	t.Parallel()
	a, b := testConsumer(t), testConsumer(t)
	stored := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	t1 := stored.Add(time.Second)

	d1 := (&fakeMsg{delivered: 1, stored: stored}).delivery(a)
	if st := d1.State(); st.Attempts != 0 || !st.FirstFailure.IsZero() {
		t.Fatalf("first delivery: %+v", st)
	}
	if err := d1.Retry(context.Background(), 0, consume.State{Attempts: 1, FirstFailure: t1, LastFailure: t1, LastError: "boom"}); err != nil {
		t.Fatal(err)
	}

	d2 := (&fakeMsg{delivered: 2, stored: stored}).delivery(b)
	if st := d2.State(); st.Attempts != 1 || !st.FirstFailure.Equal(stored) {
		t.Fatalf("B's view of delivery 2: %+v", st)
	}
	d3 := (&fakeMsg{delivered: 3, stored: stored}).delivery(a)
	if st := d3.State(); st.Attempts != 2 || !st.FirstFailure.Equal(t1) || st.LastError != "boom" {
		t.Fatalf("A's view of delivery 3: %+v", st)
	}

	// A requeue (a commit whose outcome is unknown) is A's own delivery:
	// it does not count as an attempt at the next one.
	if err := d3.Requeue(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := (&fakeMsg{delivered: 4, stored: stored}).delivery(a).State(); st.Attempts != 2 {
		t.Fatalf("after a requeue: %+v", st)
	}
	// A stale entry (the server's count went back: a new consumer) is
	// ignored.
	if st := (&fakeMsg{delivered: 2, stored: stored}).delivery(a).State(); st.Attempts != 1 || !st.FirstFailure.Equal(stored) {
		t.Fatalf("stale entry: %+v", st)
	}
}

// A dead letter published again after a crash before the original was
// terminated (the original is redelivered after AckWait) carries the same
// Nats-Msg-Id, its dead-letter id, and the dead-letter stream drops it:
// one dead letter, with the original id in its own header.
func TestDeadLetterAgainAfterCrash(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nc, err := nats.Connect(idemtest.ServiceURL(t, "IDEM_NATS_URL"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	name := "IDEMTEST_DLCRASH_" + rand.Text()
	subj := "idemtest." + name
	for _, sc := range []jetstream.StreamConfig{
		{Name: name, Subjects: []string{subj + ".work"}, Storage: jetstream.MemoryStorage},
		{Name: name + "_DLQ", Subjects: []string{subj + ".dlq"}, Storage: jetstream.MemoryStorage},
	} {
		if _, err := js.CreateStream(ctx, sc); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { js.DeleteStream(context.Background(), sc.Name) })
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, name, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewPublisher(js).Publish(ctx, subj+".work", []byte("poison"), "order-9"); err != nil {
		t.Fatal(err)
	}
	c, err := NewConsumer(js, &Config{Config: consume.Config{Name: "orders", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))},
		Stream: name, Consumer: "c", DeadLetterSubject: subj + ".dlq",
		Process: func(context.Context, idem.Message, consume.Delivery) (idem.Outcome, error) {
			return "", retry.Permanent(errors.New("bad json"))
		}})
	if err != nil {
		t.Fatal(err)
	}
	fetch := func() jetstream.Msg {
		t.Helper()
		b, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range b.Messages() {
			return m
		}
		t.Fatal("no message")
		return nil
	}
	handle := func(m jetstream.Msg) {
		t.Helper()
		d := &delivery{c: c, m: m}
		d.md, _ = m.Metadata()
		if out, err := c.engine.Handle(ctx, d); out != idem.DeadLettered || err != nil {
			t.Fatal(out, err)
		}
	}
	handle(crashBeforeTerm{fetch()}) // the dead letter is published, the Term lost
	handle(fetch())                  // redelivered after AckWait: dead-lettered again
	dlq, err := js.Stream(ctx, name+"_DLQ")
	if err != nil {
		t.Fatal(err)
	}
	if n := dlq.CachedInfo().State.Msgs; n != 1 {
		t.Fatalf("%d dead letters, want 1", n)
	}
	raw, err := dlq.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got := raw.Header.Get(jetstream.MsgIDHeader); got != DeadLetterID(name, 1) || raw.Header.Get(consume.HeaderDeadLetterID) != got ||
		raw.Header.Get(consume.HeaderOriginalID) != "order-9" || raw.Header.Get(consume.HeaderReason) != string(idem.DeadPermanent) {
		t.Fatalf("dead letter headers %v", raw.Header)
	}
}

// crashBeforeTerm loses the Term, as a crash right after the dead letter
// was published would.
type crashBeforeTerm struct{ jetstream.Msg }

func (crashBeforeTerm) Term() error { return nil }
