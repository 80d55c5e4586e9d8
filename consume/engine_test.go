package consume_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/retry"
)

// fakeDelivery records how the engine settled it.
type fakeDelivery struct {
	id, origin string
	body       []byte
	state      consume.State

	mu       sync.Mutex
	settled  []string
	delay    time.Duration
	next     consume.State
	dl       consume.DeadLetter
	settleFn func(op string) error
}

func (f *fakeDelivery) ID() string           { return f.id }
func (f *fakeDelivery) Body() []byte         { return f.body }
func (f *fakeDelivery) Origin() string       { return f.origin }
func (f *fakeDelivery) State() consume.State { return f.state }

func (f *fakeDelivery) settle(op string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.settled = append(f.settled, op)
	if f.settleFn != nil {
		return f.settleFn(op)
	}
	return nil
}
func (f *fakeDelivery) Ack(context.Context) error     { return f.settle("ack") }
func (f *fakeDelivery) Requeue(context.Context) error { return f.settle("requeue") }
func (f *fakeDelivery) Retry(_ context.Context, after time.Duration, st consume.State) error {
	f.delay, f.next = after, st
	return f.settle("retry")
}
func (f *fakeDelivery) DeadLetter(_ context.Context, dl consume.DeadLetter) error {
	f.dl = dl
	return f.settle("dead-letter")
}

func (f *fakeDelivery) ops() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strings.Join(f.settled, ",")
}

// ledger is an in-memory stand-in for a SQL store, an idem.Processor: the
// dedupe records and the effects are applied together under one lock, and
// only when the handler succeeds.
type ledger struct {
	mu      sync.Mutex
	seen    map[string]idem.Fingerprint
	effects map[string]int
}

// ledgerTx is the ledger's transaction.
type ledgerTx struct{}

var _ idem.Processor[*ledgerTx] = (*ledger)(nil)

func newLedger() *ledger {
	return &ledger{seen: map[string]idem.Fingerprint{}, effects: map[string]int{}}
}

func (l *ledger) Process(ctx context.Context, msg idem.Message, fn func(ctx context.Context, tx *ledgerTx) error) (idem.Outcome, error) {
	res, err := l.ProcessBatch(ctx, []idem.Message{msg}, func(ctx context.Context, tx *ledgerTx, _ []int) error { return fn(ctx, tx) })
	if err != nil {
		return "", err
	}
	if res[0] == idem.Mismatch {
		return idem.Mismatch, fmt.Errorf("ledger: %w", idem.ErrFingerprintMismatch)
	}
	return res[0], nil
}

func (l *ledger) ProcessBatch(ctx context.Context, msgs []idem.Message, fn func(ctx context.Context, tx *ledgerTx, fresh []int) error) ([]idem.Outcome, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	res := make([]idem.Outcome, len(msgs))
	added := map[string]idem.Fingerprint{}
	var fresh []int
	for i, m := range msgs {
		fp, ok := l.seen[m.Key]
		if !ok {
			fp, ok = added[m.Key]
		}
		switch {
		case ok && fp != m.Fingerprint:
			res[i] = idem.Mismatch
		case ok:
			res[i] = idem.Duplicate
		default:
			added[m.Key] = m.Fingerprint
			res[i] = idem.Processed
			fresh = append(fresh, i)
		}
	}
	if len(fresh) == 0 {
		return res, nil
	}
	if err := fn(ctx, &ledgerTx{}, fresh); err != nil {
		return nil, err
	}
	for k, fp := range added {
		l.seen[k] = fp
		l.effects[k]++
	}
	return res, nil
}

// process is the engine's ProcessFunc over the ledger: handler runs in its
// transaction.
func (l *ledger) process(handler func(ctx context.Context, d consume.Delivery) error) consume.ProcessFunc {
	return consume.Transactional(l, func(ctx context.Context, _ *ledgerTx, d consume.Delivery) error { return handler(ctx, d) })
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func newEngine(t *testing.T, p consume.ProcessFunc, mod func(*consume.Config)) (*consume.Engine, *consume.Counters) {
	t.Helper()
	c := &consume.Counters{}
	cfg := &consume.Config{
		Name:   "payments",
		Retry:  &retry.Policy{Base: time.Second, Cap: 8 * time.Second, MaxAttempts: 3, Jitter: retry.NoJitter},
		Hooks:  []idem.Hook{c},
		Logger: quiet,
		Now:    func() time.Time { return time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC) },
	}
	if mod != nil {
		mod(cfg)
	}
	e, err := consume.New(p, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e, c
}

func ok(context.Context, consume.Delivery) error { return nil }

func TestProcessedThenDuplicate(t *testing.T) {
	t.Parallel()
	l := newLedger()
	e, c := newEngine(t, l.process(ok), nil)
	for i, want := range []idem.Outcome{idem.Processed, idem.Duplicate, idem.Duplicate} {
		d := &fakeDelivery{id: "m1", body: []byte(`{"amount":5}`)}
		out, err := e.Handle(context.Background(), d)
		if err != nil || out != want || d.ops() != "ack" {
			t.Fatalf("delivery %d: %v %v, settled %q", i, out, err, d.ops())
		}
	}
	if s := c.Snapshot(); s.Processed != 1 || s.Duplicate != 2 || l.effects["m1"] != 1 {
		t.Fatalf("counts %+v, effects %v", s, l.effects)
	}
}

func TestAckOnlyAfterCommit(t *testing.T) {
	t.Parallel()
	var committed atomic.Bool
	p := func(ctx context.Context, msg idem.Message, d consume.Delivery) (idem.Outcome, error) {
		if strings.Contains(d.(*fakeDelivery).ops(), "ack") {
			t.Error("acked before the commit")
		}
		committed.Store(true)
		return idem.Processed, nil
	}
	e, _ := newEngine(t, p, nil)
	d := &fakeDelivery{id: "m", settleFn: func(op string) error {
		if !committed.Load() {
			t.Error("settled before the commit")
		}
		return nil
	}}
	if out, err := e.Handle(context.Background(), d); out != idem.Processed || err != nil {
		t.Fatal(out, err)
	}
}

func TestRetriesThenDeadLetters(t *testing.T) {
	t.Parallel()
	l := newLedger()
	boom := errors.New("gateway timeout")
	e, c := newEngine(t, l.process(func(context.Context, consume.Delivery) error { return boom }), nil)
	ctx := context.Background()
	st := consume.State{}
	wantDelays := []time.Duration{time.Second, 2 * time.Second}
	for attempt := 0; ; attempt++ {
		d := &fakeDelivery{id: "m", body: []byte("x"), origin: "orders/created", state: st}
		out, err := e.Handle(ctx, d)
		if err != nil {
			t.Fatal(err)
		}
		if attempt < 2 {
			if out != idem.Retried || d.delay != wantDelays[attempt] || d.next.Attempts != attempt+1 {
				t.Fatalf("attempt %d: %v delay %v state %+v", attempt, out, d.delay, d.next)
			}
			if d.next.LastError != "gateway timeout" || d.next.FirstFailure.IsZero() {
				t.Fatalf("state %+v", d.next)
			}
			st = d.next
			continue
		}
		if out != idem.DeadLettered || d.ops() != "dead-letter" {
			t.Fatalf("attempt %d: %v, %q", attempt, out, d.ops())
		}
		dl := d.dl
		if dl.Reason != idem.DeadMaxAttempts || dl.Attempts != 3 || dl.Consumer != "payments" || dl.Origin != "orders/created" || dl.LastError != "gateway timeout" ||
			dl.OriginalID != d.id || dl.DeadLetterID != "" {
			t.Fatalf("dead letter %+v", dl)
		}
		break
	}
	if s := c.Snapshot(); s.Retried != 2 || s.DeadLettered != 1 || s.Processed != 0 || len(l.effects) != 0 {
		t.Fatalf("counts %+v effects %v", s, l.effects)
	}
}

func TestPermanentDeadLettersAtOnce(t *testing.T) {
	t.Parallel()
	l := newLedger()
	e, _ := newEngine(t, l.process(func(context.Context, consume.Delivery) error {
		return fmt.Errorf("decode: %w", retry.Permanent(errors.New("bad json")))
	}), nil)
	d := &fakeDelivery{id: "m", body: []byte("{")}
	out, err := e.Handle(context.Background(), d)
	if err != nil || out != idem.DeadLettered || d.dl.Reason != idem.DeadPermanent || d.dl.Attempts != 1 {
		t.Fatalf("%v %v %+v", out, err, d.dl)
	}
}

// TestDeadLetterIsLoggedRootCauseFirst: every dead letter is a WARN line
// with its id, reason, attempts and cause, and the failure metadata puts
// the root cause before the layers that wrapped it, so that a narrow
// column or a cut keeps it.
func TestDeadLetterIsLoggedRootCauseFirst(t *testing.T) {
	t.Parallel()
	l := newLedger()
	var logs bytes.Buffer
	e, _ := newEngine(t, l.process(func(context.Context, consume.Delivery) error {
		return fmt.Errorf("ledger: apply (account %q): %w", "acct-7", retry.Permanent(errors.New("insufficient funds")))
	}), func(c *consume.Config) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	d := &fakeDelivery{id: "msg-3", body: []byte("x")}
	if out, err := e.Handle(context.Background(), d); err != nil || out != idem.DeadLettered {
		t.Fatalf("%v %v", out, err)
	}
	if want := `insufficient funds [from ledger: apply (account "acct-7")]`; d.dl.LastError != want {
		t.Errorf("LastError = %q, want %q", d.dl.LastError, want)
	}
	line := logs.String()
	for _, w := range []string{"level=WARN", `msg="idem: message dead-lettered"`, "consumer=payments", "id=msg-3", "reason=permanent", "attempts=1", `cause="insufficient funds [from`} {
		if !strings.Contains(line, w) {
			t.Errorf("log lacks %q:\n%s", w, line)
		}
	}
	if n := strings.Count(line, "\n"); n != 1 {
		t.Errorf("%d log lines for one dead letter:\n%s", n, line)
	}
}

func TestInfrastructureErrorsDoNotCount(t *testing.T) {
	t.Parallel()
	l := newLedger()
	e, c := newEngine(t, l.process(func(context.Context, consume.Delivery) error {
		return idem.Retryable(errors.New("connection refused"))
	}), nil)
	st := consume.State{Attempts: 2} // one more counted failure would dead-letter
	for i := range 20 {
		d := &fakeDelivery{id: "m", state: st}
		out, err := e.Handle(context.Background(), d)
		if err != nil || out != idem.Retried {
			t.Fatalf("retry %d: %v %v", i, out, err)
		}
		if d.next.Attempts != 2 || d.next.InfraRetries != i+1 {
			t.Fatalf("retry %d: state %+v", i, d.next)
		}
		if d.delay > 8*time.Second {
			t.Fatalf("delay %v beyond the cap", d.delay)
		}
		st = d.next
	}
	if s := c.Snapshot(); s.DeadLettered != 0 || s.InfraRetried != 20 {
		t.Fatalf("counts %+v", s)
	}
}

func TestRetryAfterIsHonoured(t *testing.T) {
	t.Parallel()
	l := newLedger()
	e, _ := newEngine(t, l.process(func(context.Context, consume.Delivery) error {
		return retry.After(time.Minute, errors.New("rate limited"))
	}), nil)
	d := &fakeDelivery{id: "m"}
	if out, _ := e.Handle(context.Background(), d); out != idem.Retried || d.delay < time.Minute {
		t.Fatalf("%v delay %v", out, d.delay)
	}
}

func TestIDConflict(t *testing.T) {
	t.Parallel()
	l := newLedger()
	e, c := newEngine(t, l.process(ok), nil)
	ctx := context.Background()
	if out, _ := e.Handle(ctx, &fakeDelivery{id: "m", body: []byte(`{"amount":5}`)}); out != idem.Processed {
		t.Fatal(out)
	}
	d := &fakeDelivery{id: "m", body: []byte(`{"amount":500}`)}
	out, err := e.Handle(ctx, d)
	if err != nil || out != idem.DeadLettered || d.dl.Reason != idem.DeadMismatch {
		t.Fatalf("%v %v %+v", out, err, d.dl)
	}
	if !strings.Contains(d.dl.LastError, "different payload") || l.effects["m"] != 1 {
		t.Fatalf("dead letter %+v, effects %v", d.dl, l.effects)
	}
	// A ProcessFunc that reports Mismatch without an error is handled too.
	e2, _ := newEngine(t, func(context.Context, idem.Message, consume.Delivery) (idem.Outcome, error) {
		return idem.Mismatch, nil
	}, nil)
	d2 := &fakeDelivery{id: "m"}
	if out, _ := e2.Handle(ctx, d2); out != idem.DeadLettered || d2.dl.Reason != idem.DeadMismatch {
		t.Fatalf("%v %+v", out, d2.dl)
	}
	if c.Snapshot().DeadLettered != 1 {
		t.Fatal(c.Snapshot())
	}
}

func TestMissingID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := newLedger()
	e, _ := newEngine(t, l.process(ok), nil)
	d := &fakeDelivery{body: []byte("hello")}
	if out, _ := e.Handle(ctx, d); out != idem.DeadLettered || d.dl.Reason != idem.DeadMissingID || len(l.effects) != 0 {
		t.Fatalf("%v %+v", out, d.dl)
	}
	bad := &fakeDelivery{id: "caf\u00e9"}
	if out, _ := e.Handle(ctx, bad); out != idem.DeadLettered || bad.dl.Reason != idem.DeadInvalidID {
		t.Fatalf("%v %+v", out, bad.dl)
	}

	ec, _ := newEngine(t, l.process(ok), func(c *consume.Config) { c.MissingID = consume.ContentKey })
	key, _ := ec.Key(&fakeDelivery{body: []byte("hello")})
	if key != "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824" {
		t.Fatalf("content key %q", key)
	}
	outs := []idem.Outcome{}
	for _, body := range []string{"hello", "hello", "hello!"} {
		out, _ := ec.Handle(ctx, &fakeDelivery{body: []byte(body)})
		outs = append(outs, out)
	}
	if fmt.Sprint(outs) != "[processed duplicate processed]" {
		t.Fatal(outs)
	}
}

func TestCommitUnknownIsNotAckedNorCounted(t *testing.T) {
	t.Parallel()
	p := func(context.Context, idem.Message, consume.Delivery) (idem.Outcome, error) {
		return "", fmt.Errorf("commit: %w: connection reset", idem.ErrCommitUnknown)
	}
	e, c := newEngine(t, p, func(c *consume.Config) { c.Retry = &retry.Policy{Base: time.Millisecond, Cap: time.Millisecond} })
	d := &fakeDelivery{id: "m", state: consume.State{Attempts: 4}}
	out, err := e.Handle(context.Background(), d)
	if err != nil || out != idem.Requeued || d.ops() != "requeue" {
		t.Fatalf("%v %v %q", out, err, d.ops())
	}
	if s := c.Snapshot(); s.Requeued != 1 || s.Retried+s.DeadLettered != 0 {
		t.Fatal(s)
	}
}

func TestCancelledContextAbandons(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	p := func(ctx context.Context, _ idem.Message, _ consume.Delivery) (idem.Outcome, error) {
		cancel()
		return "", ctx.Err()
	}
	e, _ := newEngine(t, p, nil)
	d := &fakeDelivery{id: "m"}
	if out, err := e.Handle(ctx, d); out != idem.Abandoned || err != nil || d.ops() != "" {
		t.Fatalf("%v %v %q", out, err, d.ops())
	}
	// Commit unknown while shutting down: abandoned during the wait.
	ctx2, cancel2 := context.WithCancel(context.Background())
	cancel2()
	e2, _ := newEngine(t, func(context.Context, idem.Message, consume.Delivery) (idem.Outcome, error) {
		return "", idem.ErrCommitUnknown
	}, nil)
	if out, _ := e2.Handle(ctx2, &fakeDelivery{id: "m"}); out != idem.Abandoned {
		t.Fatal(out)
	}
}

func TestPanicIsACountedFailure(t *testing.T) {
	t.Parallel()
	l := newLedger()
	e, _ := newEngine(t, l.process(func(context.Context, consume.Delivery) error { panic("poison") }), nil)
	st := consume.State{}
	for i := range 3 {
		d := &fakeDelivery{id: "p", state: st}
		out, err := e.Handle(context.Background(), d)
		if err != nil {
			t.Fatal(err)
		}
		if i < 2 && out != idem.Retried || i == 2 && out != idem.DeadLettered {
			t.Fatalf("attempt %d: %v", i, out)
		}
		st = d.next
		if i == 2 && !strings.Contains(d.dl.LastError, "panicked: poison") {
			t.Fatalf("%+v", d.dl)
		}
	}
}

func TestSettleFailureIsReported(t *testing.T) {
	t.Parallel()
	var events []consume.Event
	var mu sync.Mutex
	hook := endHook(func(_ context.Context, ev consume.Event) { mu.Lock(); events = append(events, ev); mu.Unlock() })
	l := newLedger()
	e, _ := newEngine(t, l.process(ok), func(c *consume.Config) { c.Hooks = []idem.Hook{hook} })
	closed := errors.New("channel closed")
	d := &fakeDelivery{id: "m", settleFn: func(string) error { return closed }}
	out, err := e.Handle(context.Background(), d)
	if out != idem.Processed || !errors.Is(err, closed) {
		t.Fatalf("%v %v", out, err)
	}
	if len(events) != 1 || !errors.Is(events[0].Err, closed) || events[0].Key != "m" {
		t.Fatalf("%+v", events)
	}
	// A redelivery after the failed ack is a duplicate.
	if out, _ := e.Handle(context.Background(), &fakeDelivery{id: "m"}); out != idem.Duplicate {
		t.Fatal(out)
	}
}

func TestBoundedLastError(t *testing.T) {
	t.Parallel()
	l := newLedger()
	long := strings.Repeat("é", 1000)
	e, _ := newEngine(t, l.process(func(context.Context, consume.Delivery) error { return errors.New(long) }),
		func(c *consume.Config) { c.MaxErrorBytes = 101 })
	d := &fakeDelivery{id: "m"}
	e.Handle(context.Background(), d)
	if n := len(d.next.LastError); n > 101 || n < 98 || !strings.HasPrefix(long, d.next.LastError) {
		t.Fatalf("last error %d bytes", n)
	}
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	p := newLedger().process(ok)
	for _, tc := range []struct {
		p   consume.ProcessFunc
		cfg *consume.Config
	}{
		{nil, &consume.Config{Name: "x"}},
		{p, nil},
		{p, &consume.Config{Name: string([]byte{0xff})}},
		{p, &consume.Config{Name: "x", Retention: -1}},
	} {
		if _, err := consume.New(tc.p, tc.cfg); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("New(%+v) = %v", tc.cfg, err)
		}
	}
	e, err := consume.New(p, &consume.Config{Name: "x"})
	if err != nil || e.Config().Retention != idem.DefaultRetention || e.Policy().MaxAttempts != retry.DefaultMaxAttempts {
		t.Fatal(err, e.Config(), e.Policy())
	}
	// An adapter's Config embeds consume.Config: its zero fields are the
	// engine's defaults.
	var adapter struct {
		consume.Config
		Queue string
	}
	adapter.Name = "x"
	e, err = consume.New(p, &adapter.Config)
	if err != nil {
		t.Fatal(err)
	}
	c := e.Config()
	if c.Name != "x" || c.Retention != idem.DefaultRetention || c.MaxErrorBytes != 1024 || c.MissingID != consume.DeadLetterMissingID ||
		c.Logger == nil || c.Now == nil || c.Fingerprint == nil || c.Retry != nil || e.Policy() != (&retry.Policy{}).WithDefaults() {
		t.Fatalf("effective config %+v, policy %+v", c, e.Policy())
	}
}

// TestConcurrentDuplicates delivers the same messages from many goroutines
// through a Guard over the memory store: one effect per message.
func TestConcurrentDuplicatesThroughGuard(t *testing.T) {
	t.Parallel()
	store := idemtest.NewMemoryStore(nil)
	g := idem.NewGuard(store, &idem.GuardConfig{Lease: 5 * time.Second, Logger: quiet})
	var mu sync.Mutex
	effects := map[string]int{}
	p := consume.GuardProcess(g, func(ctx context.Context, run idem.Run, d consume.Delivery) error {
		time.Sleep(time.Millisecond)
		mu.Lock()
		effects[d.ID()]++
		mu.Unlock()
		return nil
	})
	e, c := newEngine(t, p, func(c *consume.Config) { c.Retry = &retry.Policy{Base: time.Millisecond, Cap: 5 * time.Millisecond} })
	const msgs, copies = 20, 10
	var wg sync.WaitGroup
	for m := range msgs {
		for range copies {
			wg.Go(func() {
				d := &fakeDelivery{id: fmt.Sprintf("m%d", m), body: []byte("body")}
				for {
					out, err := e.Handle(context.Background(), d)
					if err != nil {
						t.Error(err)
						return
					}
					if out != idem.Retried {
						return
					}
					// The broker would redeliver after the delay.
					d = &fakeDelivery{id: d.id, body: d.body, state: d.next}
				}
			})
		}
	}
	wg.Wait()
	for m := range msgs {
		if n := effects[fmt.Sprintf("m%d", m)]; n != 1 {
			t.Fatalf("m%d: %d effects", m, n)
		}
	}
	s := c.Snapshot()
	if s.Processed != msgs || s.Duplicate != msgs*(copies-1) || s.DeadLettered != 0 {
		t.Fatalf("counts %+v", s)
	}
}

func TestGuardProcessOutcomes(t *testing.T) {
	t.Parallel()
	store := idemtest.NewMemoryStore(nil)
	g := idem.NewGuard(store, &idem.GuardConfig{Logger: quiet})
	ctx := context.Background()
	final := idem.Final(errors.New("card declined"))
	p := consume.GuardProcess(g, func(ctx context.Context, run idem.Run, d consume.Delivery) error {
		if string(d.Body()) == "decline" {
			return final
		}
		return nil
	})
	msg := idem.Message{Scope: "s", Key: "k", Fingerprint: idem.FingerprintBytes([]byte("a"))}
	d := &fakeDelivery{id: "k", body: []byte("a")}
	if r, err := p(ctx, msg, d); r != idem.Processed || err != nil {
		t.Fatal(r, err)
	}
	if r, err := p(ctx, msg, d); r != idem.Duplicate || err != nil {
		t.Fatal(r, err)
	}
	other := msg
	other.Fingerprint = idem.FingerprintBytes([]byte("b"))
	if r, err := p(ctx, other, d); r != idem.Mismatch || !errors.Is(err, idem.ErrFingerprintMismatch) {
		t.Fatal(r, err)
	}
	// Final: first run reports the error (a counted failure; Final is not
	// Permanent), the replay is a duplicate.
	dm := idem.Message{Scope: "s", Key: "d"}
	dd := &fakeDelivery{id: "d", body: []byte("decline")}
	if _, err := p(ctx, dm, dd); !errors.Is(err, final) {
		t.Fatal(err)
	}
	if r, err := p(ctx, dm, dd); r != idem.Duplicate || err != nil {
		t.Fatal(r, err)
	}
	// In progress elsewhere: an infrastructure error.
	if _, err := store.Claim(ctx, idem.ClaimRequest{Scope: "s", Key: "busy", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := p(ctx, idem.Message{Scope: "s", Key: "busy"}, d); !idem.IsRetryable(err) {
		t.Fatal(err)
	}
}
