package idemamqp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemamqp"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/retry"
	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
)

type payment struct {
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
}

func body(account string, amount int64) []byte {
	b, _ := json.Marshal(payment{account, amount})
	return b
}

// creditHandler decodes the payment and credits it in tx; fail, when set,
// decides whether this run fails.
func (e *pgEnv) creditHandler(fail func(d consume.Delivery) error) func(ctx context.Context, tx pgx.Tx, d consume.Delivery) error {
	return func(ctx context.Context, tx pgx.Tx, d consume.Delivery) error {
		var p payment
		if err := json.Unmarshal(d.Body(), &p); err != nil {
			return retry.Permanent(err)
		}
		if err := e.credit(ctx, tx, p.Account, p.Amount); err != nil {
			return err
		}
		if fail != nil {
			return fail(d)
		}
		return nil
	}
}

// idemProcess binds the consumer to idempgx.Process: the dedupe row and the
// credit commit in one transaction.
func (e *pgEnv) idemProcess(h func(ctx context.Context, tx pgx.Tx, d consume.Delivery) error) consume.ProcessFunc {
	return func(ctx context.Context, msg idem.Message, d consume.Delivery) (idem.Outcome, error) {
		return e.store.Process(ctx, msg, func(ctx context.Context, tx pgx.Tx) error { return h(ctx, tx, d) })
	}
}

// naiveProcess runs the credit in a transaction without any dedupe.
func (e *pgEnv) naiveProcess(h func(ctx context.Context, tx pgx.Tx, d consume.Delivery) error) consume.ProcessFunc {
	return func(ctx context.Context, _ idem.Message, d consume.Delivery) (idem.Outcome, error) {
		err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error { return h(ctx, tx, d) })
		if err != nil {
			return "", err
		}
		return idem.Processed, nil
	}
}

func fastRetry(maxAttempts int) *retry.Policy {
	return &retry.Policy{Base: 20 * time.Millisecond, Cap: 80 * time.Millisecond, MaxAttempts: maxAttempts}
}

func newConsumer(t testing.TB, dial idemamqp.DialFunc, topo idemamqp.Topology, p consume.ProcessFunc, mod func(*idemamqp.Config)) (*idemamqp.Consumer, *consume.Counters) {
	t.Helper()
	counters := &consume.Counters{}
	cfg := &idemamqp.Config{
		Config:   consume.Config{Name: "payments-" + suffix(), Retry: fastRetry(3), Hooks: []idem.Hook{counters}, Logger: quiet},
		Topology: topo, Process: p, Concurrency: 4,
		Reconnect: &retry.Policy{Base: 20 * time.Millisecond, Cap: 200 * time.Millisecond, MaxAttempts: -1},
	}
	if mod != nil {
		mod(cfg)
	}
	c, err := idemamqp.NewConsumer(dial, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c, counters
}

// queueDepth returns the number of ready messages in q.
func queueDepth(t testing.TB, conn *amqp.Connection, q string) int {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	info, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return info.Messages
}

// TestExercise1 is the first exercise: the same message delivered three
// times credits three times without idem and exactly once with it, thanks
// to the dedupe row's primary key committed with the credit.
func TestExercise1(t *testing.T) {
	t.Parallel()
	pg := newPG(t)
	dial := idemamqp.DialURL(amqpURL(t))
	for _, tc := range []struct {
		name    string
		process func(h func(context.Context, pgx.Tx, consume.Delivery) error) consume.ProcessFunc
		want    int64
	}{
		{"naive", pg.naiveProcess, 300},
		{"idem", pg.idemProcess, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			topo, conn := newTopology(t)
			account := tc.name + "-" + suffix()
			c, counters := newConsumer(t, dial, topo, tc.process(pg.creditHandler(nil)), nil)
			publish(t, conn, topo.Queue, "payment-1", body(account, 100), 3)
			runConsumer(t, c)
			waitFor(t, 10*time.Second, "three deliveries", func() bool {
				s := counters.Snapshot()
				return s.Processed+s.Duplicate == 3
			})
			if got, _ := pg.balance(t, account); got != tc.want {
				t.Fatalf("balance %d, want %d", got, tc.want)
			}
			waitFor(t, 5*time.Second, "an empty queue", func() bool { return queueDepth(t, conn, topo.Queue) == 0 })
		})
	}
}

// TestExercise5 is the fifth exercise: a handler that fails three times
// sends the message through the retry queue to the DLQ, where it carries
// x-death and the idem failure headers; the report has enough context to
// diagnose; after the fix a manual redrive processes it exactly once.
func TestExercise5(t *testing.T) {
	t.Parallel()
	pg := newPG(t)
	topo, conn := newTopology(t)
	var broken atomic.Bool
	broken.Store(true)
	var runs atomic.Int32
	fail := func(consume.Delivery) error {
		runs.Add(1)
		if broken.Load() {
			return errors.New("ledger service: account is frozen")
		}
		return nil
	}
	c, counters := newConsumer(t, idemamqp.DialURL(amqpURL(t)), topo, pg.idemProcess(pg.creditHandler(fail)), nil)
	name := c.Engine().Config().Name
	account := "ex5-" + suffix()
	publish(t, conn, topo.Queue, "payment-5", body(account, 42), 1)
	runConsumer(t, c)

	var dead []idemamqp.DeadMessage
	waitFor(t, 10*time.Second, "the dead letter", func() bool {
		var err error
		dead, err = idemamqp.ListDeadLetters(context.Background(), conn, topo.DeadLetterQueue, 10)
		if err != nil {
			t.Fatal(err)
		}
		return len(dead) == 1
	})
	m := dead[0]
	if m.ID != "payment-5" || m.Reason != idem.DeadMaxAttempts || m.Attempts != 3 || m.Consumer != name ||
		m.Origin != "/"+topo.Queue || !strings.Contains(m.LastError, "account is frozen") ||
		m.FirstFailure.IsZero() || m.LastFailure.Before(m.FirstFailure) {
		t.Fatalf("dead letter %+v", m.DeadLetter)
	}
	if len(m.XDeath) == 0 || m.XDeath[0].Queue != topo.RetryQueue || m.XDeath[0].Reason != "expired" || m.XDeath[0].Count != 2 {
		t.Fatalf("x-death %+v, want the retry queue's 2 expiries", m.XDeath)
	}
	report := m.Report(time.Now())
	for _, want := range []string{`"payment-5"`, "max_attempts after 3 attempt(s)", name, "account is frozen", "x-death: expired from queue", "origin: /" + topo.Queue} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q:\n%s", want, report)
		}
	}
	t.Logf("DLQ report:\n%s", report)
	if got, _ := pg.balance(t, account); got != 0 || runs.Load() != 3 {
		t.Fatalf("balance %d after %d runs; failed runs must roll back", got, runs.Load())
	}
	// Listing does not consume.
	if n := queueDepth(t, conn, topo.DeadLetterQueue); n != 1 {
		t.Fatalf("DLQ depth %d after listing", n)
	}

	broken.Store(false)
	res, err := idemamqp.Redrive(context.Background(), conn, topo.DeadLetterQueue, func(m idemamqp.DeadMessage) bool { return m.ID == "payment-5" }, nil)
	if err != nil || len(res.Redriven) != 1 {
		t.Fatalf("redrive %+v %v", res, err)
	}
	waitFor(t, 10*time.Second, "the redriven message", func() bool { return counters.Snapshot().Processed == 1 })
	if got, applied := pg.balance(t, account); got != 42 || applied != 1 {
		t.Fatalf("balance %d applied %d", got, applied)
	}
	if n := queueDepth(t, conn, topo.DeadLetterQueue); n != 0 {
		t.Fatalf("DLQ depth %d after redrive", n)
	}
	if s := counters.Snapshot(); s.DeadLettered != 1 || s.Retried != 2 {
		t.Fatalf("counts %+v", s)
	}
}

// TestPoisonMessage: a handler that panics every time is retried
// MaxAttempts times, dead-lettered once, and the consumer keeps going.
func TestPoisonMessage(t *testing.T) {
	t.Parallel()
	pg := newPG(t)
	topo, conn := newTopology(t)
	c, counters := newConsumer(t, idemamqp.DialURL(amqpURL(t)), topo, pg.idemProcess(pg.creditHandler(func(d consume.Delivery) error {
		if d.ID() == "poison" {
			panic("cannot handle this")
		}
		return nil
	})), nil)
	runConsumer(t, c)
	publish(t, conn, topo.Queue, "poison", body("p", 1), 1)
	waitFor(t, 10*time.Second, "the poison message's dead letter", func() bool { return counters.Snapshot().DeadLettered == 1 })
	publish(t, conn, topo.Queue, "healthy", body("h", 7), 1)
	waitFor(t, 10*time.Second, "the next message", func() bool { return counters.Snapshot().Processed == 1 })
	dead, err := idemamqp.ListDeadLetters(context.Background(), conn, topo.DeadLetterQueue, 10)
	if err != nil || len(dead) != 1 || !strings.Contains(dead[0].LastError, "panicked") || dead[0].Attempts != 3 {
		t.Fatalf("%+v %v", dead, err)
	}
}

// TestPermanentAndConflict: a retry.Permanent error and an id reused with a
// different payload go straight to the dead letters.
func TestPermanentAndConflict(t *testing.T) {
	t.Parallel()
	pg := newPG(t)
	topo, conn := newTopology(t)
	c, counters := newConsumer(t, idemamqp.DialURL(amqpURL(t)), topo, pg.idemProcess(pg.creditHandler(nil)), func(cfg *idemamqp.Config) { cfg.Concurrency = 1 })
	runConsumer(t, c)
	publish(t, conn, topo.Queue, "bad-json", []byte("{"), 1)
	publish(t, conn, topo.Queue, "pay-1", body("c", 5), 1)
	waitFor(t, 10*time.Second, "the first payment", func() bool { return counters.Snapshot().Processed == 1 })
	publish(t, conn, topo.Queue, "pay-1", body("c", 500), 1)
	publish(t, conn, topo.Queue, "", body("c", 9), 1) // Publish fills in the content hash
	waitFor(t, 10*time.Second, "two dead letters", func() bool { return counters.Snapshot().DeadLettered == 2 })
	waitFor(t, 10*time.Second, "the content-keyed payment", func() bool { return counters.Snapshot().Processed == 2 })
	dead, err := idemamqp.ListDeadLetters(context.Background(), conn, topo.DeadLetterQueue, 10)
	if err != nil || len(dead) != 2 {
		t.Fatal(dead, err)
	}
	reasons := map[string]idem.DeadReason{}
	for _, m := range dead {
		reasons[m.ID] = m.Reason
	}
	if reasons["bad-json"] != idem.DeadPermanent || reasons["pay-1"] != idem.DeadMismatch {
		t.Fatalf("reasons %v", reasons)
	}
	if got, _ := pg.balance(t, "c"); got != 14 {
		t.Fatalf("balance %d, want 14", got)
	}
}

// TestDuplicateStorm: several consumers on one queue, every message
// published five times: exactly one effect per message.
func TestDuplicateStorm(t *testing.T) {
	t.Parallel()
	pg := newPG(t)
	topo, conn := newTopology(t)
	const msgs, copies = 40, 5
	var all []*consume.Counters
	name := "storm-" + suffix()
	for range 3 {
		c, counters := newConsumer(t, idemamqp.DialURL(amqpURL(t)), topo, pg.idemProcess(pg.creditHandler(nil)), func(cfg *idemamqp.Config) {
			cfg.Name = name // one logical consumer, three processes
		})
		all = append(all, counters)
		runConsumer(t, c)
	}
	var wg sync.WaitGroup
	for range copies {
		wg.Go(func() {
			for i := range msgs {
				publish(t, conn, topo.Queue, fmt.Sprintf("storm-%d", i), body(fmt.Sprintf("acct-%d", i), 10), 1)
			}
		})
	}
	wg.Wait()
	total := func() (p, d int64) {
		for _, c := range all {
			s := c.Snapshot()
			p, d = p+s.Processed, d+s.Duplicate
		}
		return
	}
	waitFor(t, 20*time.Second, "every delivery", func() bool { p, d := total(); return p+d == msgs*copies })
	if p, _ := total(); p != msgs {
		t.Fatalf("processed %d, want %d", p, msgs)
	}
	for i := range msgs {
		if got, applied := pg.balance(t, fmt.Sprintf("acct-%d", i)); got != 10 || applied != 1 {
			t.Fatalf("acct-%d: balance %d applied %d", i, got, applied)
		}
	}
}

// TestConnectionLoss closes the connection while a handler runs: the
// consumer reconnects, the broker redelivers what was unacked and idem
// deduplicates it.
func TestConnectionLoss(t *testing.T) {
	t.Parallel()
	pg := newPG(t)
	topo, conn := newTopology(t)
	url := amqpURL(t)
	var (
		mu    sync.Mutex
		cur   *amqp.Connection
		dials atomic.Int32
	)
	dial := func(context.Context) (*amqp.Connection, error) {
		c, err := amqp.Dial(url)
		if err == nil {
			mu.Lock()
			cur = c
			mu.Unlock()
			dials.Add(1)
		}
		return c, err
	}
	var cut atomic.Int32
	fail := func(d consume.Delivery) error {
		// Cut the connection under three different messages, after their
		// effect but before the commit and the ack.
		if n := d.ID(); (n == "m-5" || n == "m-20" || n == "m-35") && cut.Add(1) <= 3 {
			mu.Lock()
			c := cur
			mu.Unlock()
			c.Close()
		}
		return nil
	}
	const msgs = 50
	c, counters := newConsumer(t, dial, topo, pg.idemProcess(pg.creditHandler(fail)), nil)
	runConsumer(t, c)
	for i := range msgs {
		publish(t, conn, topo.Queue, fmt.Sprintf("m-%d", i), body(fmt.Sprintf("acct-%d", i), 3), 1)
	}
	waitFor(t, 30*time.Second, "every message applied", func() bool {
		var n int
		pg.pool.QueryRow(context.Background(), fmt.Sprintf("SELECT count(*) FROM %s", pg.table())).Scan(&n)
		return n == msgs && queueDepth(t, conn, topo.Queue) == 0
	})
	waitFor(t, 10*time.Second, "a settled queue", func() bool {
		ch, _ := conn.Channel()
		defer ch.Close()
		info, err := ch.QueueDeclarePassive(topo.Queue, true, false, false, false, nil)
		return err == nil && info.Messages == 0
	})
	if dials.Load() < 2 {
		t.Fatalf("%d dials: the consumer did not reconnect", dials.Load())
	}
	for i := range msgs {
		if got, applied := pg.balance(t, fmt.Sprintf("acct-%d", i)); got != 3 || applied != 1 {
			t.Fatalf("acct-%d: balance %d applied %d", i, got, applied)
		}
	}
	t.Logf("dials %d, counts %+v", dials.Load(), counters.Snapshot())
}

func TestNewConsumerValidates(t *testing.T) {
	t.Parallel()
	p := func(context.Context, idem.Message, consume.Delivery) (idem.Outcome, error) {
		return idem.Processed, nil
	}
	dial := idemamqp.DialURL("amqp://127.0.0.1:1/")
	for _, cfg := range []*idemamqp.Config{
		nil,
		{Config: consume.Config{Name: "x"}, Process: p}, // no queue
		{Config: consume.Config{Name: ""}, Process: p, Topology: idemamqp.Topology{Queue: "q"}},
		{Config: consume.Config{Name: "x"}, Topology: idemamqp.Topology{Queue: "q"}}, // no process
		{Config: consume.Config{Name: "x", Retention: time.Minute, Retry: &retry.Policy{Cap: time.Minute, MaxAttempts: 5}}, Process: p, Topology: idemamqp.Topology{Queue: "q"}},
		{Config: consume.Config{Name: "x", Retention: time.Hour}, Process: p, Topology: idemamqp.Topology{Queue: "q"}, QueueTTL: 2 * time.Hour},
	} {
		if _, err := idemamqp.NewConsumer(dial, cfg); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("NewConsumer(%+v) = %v", cfg, err)
		}
	}
	_, err := idemamqp.NewConsumer(dial, &idemamqp.Config{Config: consume.Config{Name: "x", Retention: time.Hour}, Process: p, Topology: idemamqp.Topology{Queue: "q"}, QueueTTL: 2 * time.Hour})
	if err == nil || !strings.Contains(err.Error(), "1h0m0s") || !strings.Contains(err.Error(), "2h0m0s") {
		t.Fatalf("retention error must name both numbers: %v", err)
	}
}
