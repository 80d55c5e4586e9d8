// Package inboxtest is the behaviour suite every [inboxdriver.Backend] runs
// against its real database, plus the multi-process crash acceptance test
// ([RunAcceptance] with [ServeWorker] in re-executed test binaries).
package inboxtest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/inbox/inboxdriver"
	"github.com/idem-go/idem/retry"
)

// Env is one isolated inbox (its own schema or database file) with an
// effects table that has no unique constraint, so a second effect for a
// message would show.
type Env[Tx any] struct {
	Backend inboxdriver.Backend[Tx]
	// Effect inserts one effect row for key in tx.
	Effect func(ctx context.Context, tx Tx, key string) error
	// Effects counts effect rows per key (committed ones only).
	Effects func(ctx context.Context) (map[string]int, error)
}

// Run runs the suite as parallel subtests; newEnv is called once per
// subtest and must return an isolated, migrated, empty inbox.
func Run[Tx any](t *testing.T, newEnv func(t *testing.T) Env[Tx]) {
	t.Run("Inbox", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			fn   func(t *testing.T, env Env[Tx])
		}{
			{"Receive", testReceive[Tx]},
			{"ProcessEveryMessageOnce", testProcessAll[Tx]},
			{"FailureRollsBackAndRetries", testRetry[Tx]},
			{"DeadAfterMaxAttempts", testMaxAttempts[Tx]},
			{"PanicIsFailure", testPanic[Tx]},
			{"UnknownTypeDeadAtOnce", testUnknownType[Tx]},
			{"PermanentDeadAtOnce", testPermanent[Tx]},
			{"LeaseFencing", testLeaseFencing[Tx]},
			{"HeartbeatKeepsLongHandler", testHeartbeat[Tx]},
			{"GracefulStopReleases", testGracefulStop[Tx]},
			{"HardStopCancelsAndReleases", testHardStop[Tx]},
			{"Ordered", testOrdered[Tx]},
			{"PurgeProcessed", testPurge[Tx]},
			{"AdminRedriveDiscard", testAdmin[Tx]},
			{"InvalidArguments", testInvalid[Tx]},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				tc.fn(t, newEnv(t))
			})
		}
	})
}

// runEnd is an [inbox.RunEndHook] from a function.
type runEnd func(ev inbox.Event)

func (f runEnd) OnRunEnd(_ context.Context, ev inbox.Event) { f(ev) }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func msg(i int, typ string) inbox.Message {
	return inbox.Message{Source: "orders", ID: fmt.Sprintf("m-%05d", i), Type: typ, Payload: fmt.Appendf(nil, `{"n":%d}`, i)}
}

func receiveN[Tx any](t *testing.T, ctx context.Context, b inboxdriver.Backend[Tx], n int, typ string) {
	t.Helper()
	for i := range n {
		if _, err := b.Receive(ctx, msg(i, typ)); err != nil {
			t.Fatal(err)
		}
	}
}

// fastConfig retries within milliseconds so tests stay quick.
func fastConfig(maxAttempts int) *inbox.Config {
	return &inbox.Config{Workers: 4, BatchSize: 5, Lease: 5 * time.Second, PollInterval: 5 * time.Millisecond,
		PurgeInterval: -1, Logger: slog.New(slog.DiscardHandler), Retry: &retry.Policy{Base: time.Millisecond, Cap: 5 * time.Millisecond, MaxAttempts: maxAttempts}}
}

func newWorker[Tx any](t *testing.T, env Env[Tx], cfg *inbox.Config, handlers map[string]inbox.Handler[Tx]) *inbox.Worker[Tx] {
	t.Helper()
	w, err := inbox.NewWorker(env.Backend, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for typ, h := range handlers {
		if err := w.Handle(typ, h); err != nil {
			t.Fatal(err)
		}
	}
	return w
}

// drain runs the worker until no row is pending or running.
func drain[Tx any](t *testing.T, ctx context.Context, env Env[Tx], w *inbox.Worker[Tx]) {
	t.Helper()
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := w.Stop(ctx); err != nil {
			t.Error(err)
		}
	}()
	waitIdle(t, ctx, env.Backend)
}

func waitIdle[Tx any](t *testing.T, ctx context.Context, b inboxdriver.Backend[Tx]) {
	t.Helper()
	for {
		st := stats(t, ctx, b)
		if st[inbox.StatePending].Count+st[inbox.StateRunning].Count == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("inbox not drained: %+v", st)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func stats[Tx any](t *testing.T, ctx context.Context, b inboxdriver.Backend[Tx]) map[inbox.State]inbox.StateCount {
	t.Helper()
	list, err := b.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != len(inboxdriver.States()) {
		t.Fatalf("Stats listed %d states, want %d", len(list), len(inboxdriver.States()))
	}
	out := map[inbox.State]inbox.StateCount{}
	for _, c := range list {
		out[c.State] = c
	}
	return out
}

func effects[Tx any](t *testing.T, ctx context.Context, env Env[Tx]) map[string]int {
	t.Helper()
	m, err := env.Effects(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// effectHandler inserts the effect, then returns fail(msg).
func effectHandler[Tx any](env Env[Tx], fail func(m inbox.Message) error) inbox.Handler[Tx] {
	return func(ctx context.Context, tx Tx, m inbox.Message) error {
		if err := env.Effect(ctx, tx, m.ID); err != nil {
			return err
		}
		if fail != nil {
			return fail(m)
		}
		return nil
	}
}

func onlyRow[Tx any](t *testing.T, ctx context.Context, b inboxdriver.Backend[Tx], state inbox.State) (inbox.Row, []inbox.Attempt) {
	t.Helper()
	rows, err := b.List(ctx, inbox.ListRequest{State: state})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 {
		t.Fatalf("%d %s rows, want 1", len(rows), state)
	}
	r, hist, err := b.Get(ctx, rows[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	return r, hist
}

func testReceive[Tx any](t *testing.T, env Env[Tx]) {
	ctx := ctxT(t)
	b := env.Backend
	m := msg(1, "order.created")
	for i, want := range []bool{true, false, false} {
		isNew, err := b.Receive(ctx, m)
		if err != nil || isNew != want {
			t.Fatalf("receive #%d = %v, %v; want %v", i+1, isNew, err, want)
		}
	}
	other := m
	other.Payload = []byte(`{"n":999}`)
	isNew, err := b.Receive(ctx, other)
	if isNew || !errors.Is(err, idem.ErrFingerprintMismatch) || !strings.Contains(err.Error(), strconv.Quote(m.ID)) || !strings.Contains(err.Error(), "(row ") {
		t.Fatalf("receive with other payload = %v, %v; want a mismatch naming the message and its row", isNew, err)
	}
	// The same id from another source is another message.
	m2 := m
	m2.Source = "billing"
	if isNew, err := b.Receive(ctx, m2); err != nil || !isNew {
		t.Fatalf("same id, other source = %v, %v", isNew, err)
	}
	r, _ := onlyRowBy(t, ctx, b, m.ID, "orders")
	if string(r.Payload) != string(m.Payload) || r.State != inbox.StatePending || r.Attempts != 0 || r.Type != m.Type {
		t.Fatalf("stored row %+v", r)
	}
	if r.Fingerprint != idem.FingerprintParts([]byte(m.Type), m.Payload) {
		t.Fatal("default fingerprint is not SHA-256 over type and payload")
	}
	if st := stats(t, ctx, b); st[inbox.StatePending].Count != 2 || st[inbox.StatePending].Oldest < 0 {
		t.Fatalf("stats %+v", st)
	}
	// 24 goroutines receiving the same 20 messages: 20 rows, each new once.
	var news atomic.Int64
	var wg sync.WaitGroup
	for range 24 {
		wg.Go(func() {
			for i := 100; i < 120; i++ {
				isNew, err := b.Receive(ctx, msg(i, "order.created"))
				if err != nil {
					t.Error(err)
					return
				}
				if isNew {
					news.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if news.Load() != 20 {
		t.Fatalf("%d receives were new, want 20", news.Load())
	}
}

func onlyRowBy[Tx any](t *testing.T, ctx context.Context, b inboxdriver.Backend[Tx], id, source string) (inbox.Row, []inbox.Attempt) {
	t.Helper()
	for _, st := range inboxdriver.States() {
		rows, err := b.List(ctx, inbox.ListRequest{State: st, Limit: inbox.MaxBatch})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			if r.MessageID == id && r.Source == source {
				r, h, err := b.Get(ctx, r.ID)
				if err != nil {
					t.Fatal(err)
				}
				return r, h
			}
		}
	}
	t.Fatalf("no row for %s/%s", source, id)
	return inbox.Row{}, nil
}

func testProcessAll[Tx any](t *testing.T, env Env[Tx]) {
	ctx := ctxT(t)
	const n = 200
	receiveN(t, ctx, env.Backend, n, "a")
	var processed atomic.Int64
	cfg := fastConfig(5)
	cfg.Workers = 8
	cfg.Hooks = []idem.Hook{runEnd(func(ev inbox.Event) {
		if ev.Outcome == idem.Processed {
			processed.Add(1)
		}
	})}
	w := newWorker(t, env, cfg, map[string]inbox.Handler[Tx]{"a": effectHandler(env, nil)})
	drain(t, ctx, env, w)
	eff := effects(t, ctx, env)
	if len(eff) != n || processed.Load() != n {
		t.Fatalf("%d effects, %d processed events; want %d", len(eff), processed.Load(), n)
	}
	for k, c := range eff {
		if c != 1 {
			t.Fatalf("%s has %d effects", k, c)
		}
	}
	if st := stats(t, ctx, env.Backend); st[inbox.StateProcessed].Count != n {
		t.Fatalf("stats %+v", st)
	}
}

func testRetry[Tx any](t *testing.T, env Env[Tx]) {
	ctx := ctxT(t)
	receiveN(t, ctx, env.Backend, 1, "a")
	var runs atomic.Int64
	w := newWorker(t, env, fastConfig(5), map[string]inbox.Handler[Tx]{"a": effectHandler(env, func(m inbox.Message) error {
		if n := runs.Add(1); int(n) != m.Attempt {
			return retry.Permanent(fmt.Errorf("run %d saw attempt %d", n, m.Attempt))
		}
		if m.Attempt <= 2 {
			return fmt.Errorf("flaky %d", m.Attempt)
		}
		return nil
	})})
	drain(t, ctx, env, w)
	r, hist := onlyRow(t, ctx, env.Backend, inbox.StateProcessed)
	if r.Attempts != 2 || len(hist) != 2 || hist[0].Error != "flaky 1" || hist[1].Error != "flaky 2" || hist[1].Number != 2 || r.ProcessedAt.IsZero() {
		t.Fatalf("row %+v history %+v", r, hist)
	}
	if eff := effects(t, ctx, env); eff[r.MessageID] != 1 {
		t.Fatalf("effects %v: failed runs must roll their effect back", eff)
	}
}

func testMaxAttempts[Tx any](t *testing.T, env Env[Tx]) {
	ctx := ctxT(t)
	receiveN(t, ctx, env.Backend, 1, "a")
	w := newWorker(t, env, fastConfig(3), map[string]inbox.Handler[Tx]{"a": effectHandler(env, func(m inbox.Message) error {
		return fmt.Errorf("boom %d", m.Attempt)
	})})
	drain(t, ctx, env, w)
	r, hist := onlyRow(t, ctx, env.Backend, inbox.StateDead)
	if r.Attempts != 3 || len(hist) != 3 || r.LastError != "boom 3" || r.DeadReason != idem.DeadMaxAttempts {
		t.Fatalf("dead row %+v history %+v", r, hist)
	}
	for i, a := range hist {
		if a.Number != i+1 || a.Error != fmt.Sprintf("boom %d", i+1) || a.At.IsZero() {
			t.Fatalf("history %+v", hist)
		}
	}
	if len(effects(t, ctx, env)) != 0 {
		t.Fatal("a dead message left an effect")
	}
	if st := stats(t, ctx, env.Backend); st[inbox.StateDead].Count != 1 || st[inbox.StateDead].Oldest <= 0 {
		t.Fatalf("stats %+v", st)
	}
}

func testPanic[Tx any](t *testing.T, env Env[Tx]) {
	ctx := ctxT(t)
	receiveN(t, ctx, env.Backend, 1, "a")
	w := newWorker(t, env, fastConfig(2), map[string]inbox.Handler[Tx]{"a": effectHandler(env, func(m inbox.Message) error {
		panic("nil map")
	})})
	drain(t, ctx, env, w)
	r, hist := onlyRow(t, ctx, env.Backend, inbox.StateDead)
	if r.Attempts != 2 || len(hist) != 2 || !strings.Contains(r.LastError, "panicked: nil map") {
		t.Fatalf("row %+v", r)
	}
	if len(effects(t, ctx, env)) != 0 {
		t.Fatal("a panicking handler's effect committed")
	}
}

func testUnknownType[Tx any](t *testing.T, env Env[Tx]) {
	ctx := ctxT(t)
	receiveN(t, ctx, env.Backend, 1, "mystery.event")
	w := newWorker(t, env, fastConfig(5), map[string]inbox.Handler[Tx]{"a": effectHandler(env, nil)})
	drain(t, ctx, env, w)
	r, hist := onlyRow(t, ctx, env.Backend, inbox.StateDead)
	if r.Attempts != 1 || len(hist) != 1 || r.DeadReason != idem.DeadNoHandler || !strings.Contains(r.LastError, `no handler registered for event type "mystery.event"`) {
		t.Fatalf("row %+v", r)
	}
}

func testPermanent[Tx any](t *testing.T, env Env[Tx]) {
	ctx := ctxT(t)
	receiveN(t, ctx, env.Backend, 1, "a")
	w := newWorker(t, env, fastConfig(5), map[string]inbox.Handler[Tx]{"a": effectHandler(env, func(inbox.Message) error {
		return retry.Permanent(errors.New("amount must be positive"))
	})})
	drain(t, ctx, env, w)
	r, _ := onlyRow(t, ctx, env.Backend, inbox.StateDead)
	if r.Attempts != 1 || r.DeadReason != idem.DeadPermanent || r.LastError != "amount must be positive" {
		t.Fatalf("row %+v", r)
	}
}

func testLeaseFencing[Tx any](t *testing.T, env Env[Tx]) {
	ctx := ctxT(t)
	b := env.Backend
	receiveN(t, ctx, b, 1, "a")
	first, err := b.Claim(ctx, inboxdriver.ClaimRequest{Limit: 10, Lease: 400 * time.Millisecond})
	if err != nil || len(first) != 1 || first[0].State != inbox.StateRunning || first[0].Token == 0 {
		t.Fatalf("claim = %+v, %v", first, err)
	}
	// Live lease: nothing to claim.
	if rows, err := b.Claim(ctx, inboxdriver.ClaimRequest{Limit: 10, Lease: time.Minute}); err != nil || len(rows) != 0 {
		t.Fatalf("claim during a live lease = %+v, %v", rows, err)
	}
	time.Sleep(450 * time.Millisecond)
	second, err := b.Claim(ctx, inboxdriver.ClaimRequest{Limit: 10, Lease: time.Minute})
	if err != nil || len(second) != 1 || second[0].Token <= first[0].Token {
		t.Fatalf("takeover = %+v, %v", second, err)
	}
	stale := inboxdriver.Lease{ID: first[0].ID, Token: first[0].Token}
	err = b.Complete(ctx, stale, func(ctx context.Context, tx Tx) error { return env.Effect(ctx, tx, "stale") })
	if !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("complete with a stale token = %v, want ErrLeaseLost", err)
	}
	if err := b.Fail(ctx, inboxdriver.FailRequest{Lease: stale, Error: "x"}); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("fail with a stale token = %v", err)
	}
	if kept, err := b.Extend(ctx, []inboxdriver.Lease{stale}, time.Minute); err != nil || len(kept) != 0 {
		t.Fatalf("extend with a stale token = %v, %v", kept, err)
	}
	if n, err := b.Release(ctx, []inboxdriver.Lease{stale}); err != nil || n != 0 {
		t.Fatalf("release with a stale token = %v, %v", n, err)
	}
	cur := inboxdriver.Lease{ID: second[0].ID, Token: second[0].Token}
	if kept, err := b.Extend(ctx, []inboxdriver.Lease{cur}, 50*time.Millisecond); err != nil || len(kept) != 1 || kept[0] != cur.ID {
		t.Fatalf("extend = %v, %v", kept, err)
	}
	if err := b.Complete(ctx, cur, func(ctx context.Context, tx Tx) error { return env.Effect(ctx, tx, "current") }); err != nil {
		t.Fatal(err)
	}
	// The lease would have expired by now; a completed row is never reclaimed.
	time.Sleep(80 * time.Millisecond)
	if rows, err := b.Claim(ctx, inboxdriver.ClaimRequest{Limit: 10, Lease: time.Minute}); err != nil || len(rows) != 0 {
		t.Fatalf("claim after completion = %+v, %v", rows, err)
	}
	if err := b.Complete(ctx, cur, func(ctx context.Context, tx Tx) error { return nil }); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("second complete = %v", err)
	}
	if eff := effects(t, ctx, env); len(eff) != 1 || eff["current"] != 1 {
		t.Fatalf("effects %v: only the current holder may commit", eff)
	}
}

func testHeartbeat[Tx any](t *testing.T, env Env[Tx]) {
	ctx := ctxT(t)
	receiveN(t, ctx, env.Backend, 3, "a")
	var mu sync.Mutex
	var lost []string
	cfg := fastConfig(5)
	// The batch runs five leases long. The lease leaves each heartbeat
	// (every Lease/3, with Lease/3 to finish) room for a busy machine: with
	// 150ms, a 50ms extension stuck behind parallel tests' writes lost the
	// lease now and then under -race.
	cfg.Workers, cfg.BatchSize, cfg.Lease = 1, 3, 600*time.Millisecond
	cfg.Hooks = []idem.Hook{runEnd(func(ev inbox.Event) {
		if ev.Outcome != idem.Processed {
			mu.Lock()
			lost = append(lost, fmt.Sprintf("%s: %v (%v)", ev.Message.ID, ev.Outcome, ev.Err))
			mu.Unlock()
		}
	})}
	w := newWorker(t, env, cfg, map[string]inbox.Handler[Tx]{"a": effectHandler(env, func(inbox.Message) error {
		time.Sleep(time.Second)
		return nil
	})})
	drain(t, ctx, env, w)
	mu.Lock()
	defer mu.Unlock()
	if len(lost) != 0 || len(effects(t, ctx, env)) != 3 {
		t.Fatalf("runs that did not process: %q; effects %v", lost, effects(t, ctx, env))
	}
}

func testGracefulStop[Tx any](t *testing.T, env Env[Tx]) {
	ctx := ctxT(t)
	receiveN(t, ctx, env.Backend, 10, "a")
	started := make(chan struct{}, 10)
	cfg := fastConfig(5)
	cfg.Workers, cfg.BatchSize = 1, 10
	w := newWorker(t, env, cfg, map[string]inbox.Handler[Tx]{"a": effectHandler(env, func(inbox.Message) error {
		started <- struct{}{}
		time.Sleep(100 * time.Millisecond)
		return nil
	})})
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	<-started
	if err := w.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	st := stats(t, ctx, env.Backend)
	if st[inbox.StateProcessed].Count != 1 || st[inbox.StatePending].Count != 9 || st[inbox.StateRunning].Count != 0 {
		t.Fatalf("after a graceful stop: %+v; want the running row finished and the rest released", st)
	}
	// Released rows are due at once.
	if rows, err := env.Backend.Claim(ctx, inboxdriver.ClaimRequest{Limit: 100, Lease: time.Minute}); err != nil || len(rows) != 9 {
		t.Fatalf("claim after stop = %d rows, %v", len(rows), err)
	}
}

func testHardStop[Tx any](t *testing.T, env Env[Tx]) {
	ctx := ctxT(t)
	receiveN(t, ctx, env.Backend, 2, "a")
	started := make(chan struct{}, 2)
	cfg := fastConfig(5)
	cfg.Workers, cfg.BatchSize = 1, 2
	hctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w2 := newWorker(t, env, cfg, map[string]inbox.Handler[Tx]{"a": func(ctx context.Context, tx Tx, m inbox.Message) error {
		started <- struct{}{}
		<-ctx.Done() // stands for a handler stuck on a slow call
		return ctx.Err()
	}})
	if err := w2.Start(hctx); err != nil {
		t.Fatal(err)
	}
	<-started
	sctx, scancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer scancel()
	if err := w2.Stop(sctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("stop past its deadline = %v", err)
	}
	st := stats(t, ctx, env.Backend)
	if st[inbox.StatePending].Count != 2 || st[inbox.StateRunning].Count != 0 {
		t.Fatalf("after a hard stop: %+v; want both rows released", st)
	}
	rows, err := env.Backend.List(ctx, inbox.ListRequest{State: inbox.StatePending})
	if err != nil || len(rows) != 2 || rows[0].Attempts != 0 || rows[1].Attempts != 0 {
		t.Fatalf("released rows %+v, %v: a stop is not the message's failure", rows, err)
	}
}

func testOrdered[Tx any](t *testing.T, env Env[Tx]) {
	ctx := ctxT(t)
	b := env.Backend
	for i := range 6 {
		m := msg(i, "a")
		m.OrderingKey = []string{"k", "j"}[i%2]
		if _, err := b.Receive(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	var order []string
	failedOnce := false
	cfg := fastConfig(5)
	cfg.Ordered = true
	cfg.Workers = 4
	cfg.BatchSize = 10
	cfg.Retry.Base, cfg.Retry.Cap = 100*time.Millisecond, 100*time.Millisecond
	w := newWorker(t, env, cfg, map[string]inbox.Handler[Tx]{"a": effectHandler(env, func(m inbox.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if m.ID == "m-00000" && !failedOnce {
			failedOnce = true
			return retry.After(300*time.Millisecond, errors.New("hold k back"))
		}
		order = append(order, m.OrderingKey+":"+m.ID)
		return nil
	})})
	drain(t, ctx, env, w)
	var k, j []string
	for _, o := range order {
		if strings.HasPrefix(o, "k:") {
			k = append(k, o)
		} else {
			j = append(j, o)
		}
	}
	if strings.Join(k, ",") != "k:m-00000,k:m-00002,k:m-00004" || strings.Join(j, ",") != "j:m-00001,j:m-00003,j:m-00005" {
		t.Fatalf("order %v: each key must run in receive order", order)
	}
	// k's first message was retried 300ms later; j's first ran meanwhile.
	if order[0] != "j:m-00001" {
		t.Fatalf("order %v: key j was held back by k's failure", order)
	}
}

func testPurge[Tx any](t *testing.T, env Env[Tx]) {
	ctx := ctxT(t)
	b := env.Backend
	receiveN(t, ctx, b, 7, "a")
	w := newWorker(t, env, fastConfig(1), map[string]inbox.Handler[Tx]{"a": effectHandler(env, func(m inbox.Message) error {
		if m.ID == "m-00000" {
			return errors.New("dead one")
		}
		return nil
	})})
	drain(t, ctx, env, w)
	if n, err := b.PurgeProcessed(ctx, time.Hour, 2); err != nil || n != 0 {
		t.Fatalf("purge within retention = %d, %v", n, err)
	}
	time.Sleep(5 * time.Millisecond)
	if n, err := b.PurgeProcessed(ctx, time.Millisecond, 2); err != nil || n != 6 {
		t.Fatalf("purge = %d, %v; want the 6 processed rows in batches of 2", n, err)
	}
	st := stats(t, ctx, b)
	if st[inbox.StateProcessed].Count != 0 || st[inbox.StateDead].Count != 1 {
		t.Fatalf("stats after purge %+v: dead rows must stay", st)
	}
	// After the retention window the id counts as new again.
	if isNew, err := b.Receive(ctx, msg(3, "a")); err != nil || !isNew {
		t.Fatalf("receive after purge = %v, %v", isNew, err)
	}
}

func testAdmin[Tx any](t *testing.T, env Env[Tx]) {
	ctx := ctxT(t)
	b := env.Backend
	receiveN(t, ctx, b, 5, "a")
	var fixed atomic.Bool
	w := newWorker(t, env, fastConfig(2), map[string]inbox.Handler[Tx]{"a": effectHandler(env, func(inbox.Message) error {
		if !fixed.Load() {
			return errors.New("downstream down")
		}
		return nil
	})})
	drain(t, ctx, env, w)
	dead, err := b.List(ctx, inbox.ListRequest{State: inbox.StateDead, Limit: 2})
	if err != nil || len(dead) != 2 {
		t.Fatalf("list = %d, %v", len(dead), err)
	}
	more, err := b.List(ctx, inbox.ListRequest{State: inbox.StateDead, AfterID: dead[1].ID})
	if err != nil || len(more) != 3 || more[0].ID <= dead[1].ID {
		t.Fatalf("list page 2 = %d, %v", len(more), err)
	}
	if _, _, err := b.Get(ctx, 1<<40); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("get missing = %v", err)
	}
	fixed.Store(true)
	if n, err := b.Redrive(ctx, inbox.Select{IDs: []int64{dead[0].ID}}); err != nil || n != 1 {
		t.Fatalf("redrive one = %d, %v", n, err)
	}
	r, hist, err := b.Get(ctx, dead[0].ID)
	if err != nil || r.State != inbox.StatePending || r.Attempts != 0 || r.DeadReason != "" || len(hist) != 2 {
		t.Fatalf("redriven row %+v history %d, %v", r, len(hist), err)
	}
	w2 := newWorker(t, env, fastConfig(2), map[string]inbox.Handler[Tx]{"a": effectHandler(env, nil)})
	drain(t, ctx, env, w2)
	if st := stats(t, ctx, b); st[inbox.StateProcessed].Count != 1 || st[inbox.StateDead].Count != 4 {
		t.Fatalf("stats %+v", st)
	}
	if n, err := b.Discard(ctx, inbox.Select{IDs: []int64{more[0].ID}}); err != nil || n != 1 {
		t.Fatalf("discard one = %d, %v", n, err)
	}
	if n, err := b.Redrive(ctx, inbox.Select{IDs: []int64{more[0].ID}}); err != nil || n != 0 {
		t.Fatalf("redrive of a discarded row = %d, %v", n, err)
	}
	if n, err := b.Discard(ctx, inbox.Select{All: true}); err != nil || n != 3 {
		t.Fatalf("discard all = %d, %v", n, err)
	}
	// Redrive and discard only touch dead rows.
	processed, _ := onlyRow(t, ctx, b, inbox.StateProcessed)
	if n, err := b.Discard(ctx, inbox.Select{IDs: []int64{processed.ID}}); err != nil || n != 0 {
		t.Fatalf("discard a processed row = %d, %v", n, err)
	}
}

func testInvalid[Tx any](t *testing.T, env Env[Tx]) {
	ctx := ctxT(t)
	b := env.Backend
	bad := []inbox.Message{
		{Source: "s", ID: "", Type: "a"},
		{Source: "s", ID: "tab\tid", Type: "a"},
		{Source: "s", ID: "x", Type: ""},
		{Source: "s", ID: "x", Type: "a", Payload: make([]byte, inbox.MaxPayloadBytes+1)},
		{Source: "s", ID: "x", Type: "a", OrderingKey: strings.Repeat("k", inbox.MaxOrderingKeyLen+1)},
	}
	for _, m := range bad {
		if _, err := b.Receive(ctx, m); err == nil {
			t.Errorf("receive %q/%q accepted", m.ID, m.Type)
		}
	}
	for _, req := range []inboxdriver.ClaimRequest{{Limit: 0, Lease: time.Second}, {Limit: inbox.MaxBatch + 1, Lease: time.Second}, {Limit: 1}} {
		if _, err := b.Claim(ctx, req); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("claim %+v = %v", req, err)
		}
	}
	for _, sel := range []inbox.Select{{}, {All: true, IDs: []int64{1}}} {
		if _, err := b.Redrive(ctx, sel); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("redrive %+v = %v", sel, err)
		}
		if _, err := b.Discard(ctx, sel); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("discard %+v = %v", sel, err)
		}
	}
	if _, err := b.List(ctx, inbox.ListRequest{State: inbox.StateDead, Limit: -1}); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("list with a negative limit = %v", err)
	}
	if _, err := b.Extend(ctx, []inboxdriver.Lease{{ID: 1, Token: 1}}, 0); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("extend with lease 0 = %v", err)
	}
	if _, err := b.PurgeProcessed(ctx, -time.Second, 0); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("purge with a negative window = %v", err)
	}
	if err := b.Complete(ctx, inboxdriver.Lease{ID: 1, Token: 1}, nil); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("complete with a nil handler = %v", err)
	}
	var zero Tx
	if _, err := b.ReceiveTx(ctx, zero, msg(1, "a")); err == nil {
		t.Error("ReceiveTx with a nil transaction accepted")
	}
}
