// Package outboxtest is the behaviour suite every [outboxdriver.Backend]
// runs against its real database ([Run]), plus the multi-process crash
// acceptance test ([RunAcceptance] with [ServeRelay] in re-executed test
// binaries), as inbox/inboxtest is for the inbox.
package outboxtest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/outbox/outboxdriver"
	"github.com/idem-go/idem/retry"
)

// Env is one isolated outbox (its own schema or database file).
type Env[Tx any] struct {
	Backend outboxdriver.Backend[Tx]
	// InTx runs fn in a new transaction of the outbox's database and
	// commits it when fn returns nil; otherwise it rolls back and returns
	// fn's error.
	InTx func(ctx context.Context, fn func(ctx context.Context, tx Tx) error) error
	// Record and Recorded stand for a broker in the acceptance test: Record
	// durably appends one line per published id (outside any outbox
	// transaction), Recorded counts the lines per id. Only [RunAcceptance]
	// and [ServeRelay] use them.
	Record   func(ctx context.Context, ids []string) error
	Recorded func(ctx context.Context) (map[string]int, error)
	// SingleWriter says the database serialises writers across processes
	// (SQLite): under -race, where its transpiled C runs several times
	// slower, the acceptance test runs a smaller default load.
	SingleWriter bool
}

// Run runs the suite as parallel subtests; newEnv is called once per
// subtest and must return an isolated, migrated, empty outbox.
func Run[Tx any](t *testing.T, newEnv func(t *testing.T) Env[Tx]) {
	t.Run("Outbox", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			fn   func(t *testing.T, env Env[Tx])
		}{
			{"WriteCommitRollback", testWrite[Tx]},
			{"WriteValidatesFirst", testWriteInvalid[Tx]},
			{"ConcurrentRelaysPublishEveryCommittedEventOnce", testConcurrent[Tx]},
			{"RetryThenSent", testRetry[Tx]},
			{"DeadAfterMaxAttempts", testMaxAttempts[Tx]},
			{"PermanentDeadAtOnce", testPermanent[Tx]},
			{"InfrastructureFailureUncounted", testUncounted[Tx]},
			{"BadPublisherResults", testBadPublisher[Tx]},
			{"LeaseFencing", testFencing[Tx]},
			{"Ordered", testOrdered[Tx]},
			{"DeadEventHoldsItsKey", testDeadHoldsKey[Tx]},
			{"HardStopReleases", testHardStop[Tx]},
			{"PurgeSent", testPurge[Tx]},
			{"Admin", testAdmin[Tx]},
			{"InvalidArguments", testInvalid[Tx]},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				tc.fn(t, newEnv(t))
			})
		}
	})
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func event(i int, key string) outbox.Event {
	return outbox.Event{Topic: "orders", Key: key, ID: fmt.Sprintf("ev-%05d", i), Payload: fmt.Appendf(nil, `{"n":%d}`, i),
		Headers: map[string]string{"content-type": "application/json"}}
}

func write[Tx any](t *testing.T, ctx context.Context, env Env[Tx], evs ...outbox.Event) {
	t.Helper()
	if err := env.InTx(ctx, func(ctx context.Context, tx Tx) error { return env.Backend.Write(ctx, tx, evs...) }); err != nil {
		t.Fatal(err)
	}
}

func writeN[Tx any](t *testing.T, ctx context.Context, env Env[Tx], n int, key func(i int) string) {
	t.Helper()
	evs := make([]outbox.Event, n)
	for i := range n {
		k := ""
		if key != nil {
			k = key(i)
		}
		evs[i] = event(i, k)
	}
	for len(evs) > 0 {
		k := min(len(evs), outbox.MaxBatch)
		write(t, ctx, env, evs[:k]...)
		evs = evs[k:]
	}
}

// fastConfig retries within milliseconds so tests stay quick.
func fastConfig(maxAttempts int) *outbox.Config {
	return &outbox.Config{Workers: 4, BatchSize: 5, Lease: 10 * time.Second, PollInterval: 5 * time.Millisecond,
		PurgeInterval: -1, Logger: slog.New(slog.DiscardHandler),
		Retry: &retry.Policy{Base: time.Millisecond, Cap: 5 * time.Millisecond, MaxAttempts: maxAttempts}}
}

// recorder is a Publisher that records every message it confirms.
type recorder struct {
	mu   sync.Mutex
	seen map[string]int
	all  []outbox.Message
	fail func(m outbox.Message) error
}

func newRecorder(fail func(m outbox.Message) error) *recorder {
	return &recorder{seen: map[string]int{}, fail: fail}
}

func (r *recorder) Publish(_ context.Context, msgs []outbox.Message) []error {
	errs := make([]error, len(msgs))
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, m := range msgs {
		if r.fail != nil {
			if errs[i] = r.fail(m); errs[i] != nil {
				continue
			}
		}
		r.seen[m.ID]++
		r.all = append(r.all, m)
	}
	return errs
}

func (r *recorder) counts() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.seen)
}

// outcomes is a PublishEndHook counting outcomes per event id.
type outcomes struct {
	mu sync.Mutex
	by map[idem.Outcome]map[string]int
}

func newOutcomes() *outcomes { return &outcomes{by: map[idem.Outcome]map[string]int{}} }

func (o *outcomes) OnPublishEnd(_ context.Context, r outbox.Result) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.by[r.Outcome] == nil {
		o.by[r.Outcome] = map[string]int{}
	}
	o.by[r.Outcome][r.Message.ID]++
}

func (o *outcomes) get(out idem.Outcome) map[string]int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return maps.Clone(o.by[out])
}

func newRelay(t *testing.T, d outbox.Driver, pub outbox.Publisher, cfg *outbox.Config) *outbox.Relay {
	t.Helper()
	r, err := outbox.NewRelay(d, pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// drain runs the relays until no event is pending or sending.
func drain(t *testing.T, ctx context.Context, d outbox.Driver, relays ...*outbox.Relay) {
	t.Helper()
	for _, r := range relays {
		if err := r.Start(ctx); err != nil {
			t.Fatal(err)
		}
	}
	defer func() {
		for _, r := range relays {
			if err := r.Stop(ctx); err != nil {
				t.Error(err)
			}
		}
	}()
	waitIdle(t, ctx, d)
}

func waitIdle(t *testing.T, ctx context.Context, d outbox.Driver) {
	t.Helper()
	for {
		st := stats(t, ctx, d)
		if st[outbox.StatePending].Count+st[outbox.StateSending].Count == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("outbox not drained: %+v", st)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func stats(t *testing.T, ctx context.Context, d outbox.Driver) map[outbox.State]outbox.StateCount {
	t.Helper()
	list, err := d.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != len(outboxdriver.States()) {
		t.Fatalf("Stats listed %d states, want %d", len(list), len(outboxdriver.States()))
	}
	out := map[outbox.State]outbox.StateCount{}
	for _, c := range list {
		out[c.State] = c
	}
	return out
}

// listAll lists every event in st, in small pages (so paging is tested).
func listAll(t *testing.T, ctx context.Context, d outbox.Driver, st outbox.State) []outbox.Row {
	t.Helper()
	return listPaged(t, ctx, d, st, 7)
}

// listPaged lists every event in st, page rows at a time.
func listPaged(t *testing.T, ctx context.Context, d outbox.Driver, st outbox.State, page int) []outbox.Row {
	t.Helper()
	var (
		out   []outbox.Row
		after int64
	)
	for {
		rows, err := d.List(ctx, outbox.ListRequest{State: st, AfterID: after, Limit: page})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, rows...)
		if len(rows) < page {
			return out
		}
		after = rows[len(rows)-1].ID
	}
}

func onlyRow(t *testing.T, ctx context.Context, d outbox.Driver, st outbox.State) outbox.Row {
	t.Helper()
	rows := listAll(t, ctx, d, st)
	if len(rows) != 1 {
		t.Fatalf("%d %s events, want 1", len(rows), st)
	}
	return rows[0]
}

func testWrite[Tx any](t *testing.T, env Env[Tx]) {
	ctx := ctxT(t)
	b := env.Backend
	write(t, ctx, env, event(1, "a"), event(2, "a"), event(3, ""))
	rollback := errors.New("business rule failed")
	err := env.InTx(ctx, func(ctx context.Context, tx Tx) error {
		if err := b.Write(ctx, tx, event(4, "a"), event(5, "b")); err != nil {
			return err
		}
		return rollback
	})
	if !errors.Is(err, rollback) {
		t.Fatalf("rolled-back tx: %v", err)
	}
	// A repeated id is skipped, in another transaction or the same one.
	dup := event(1, "a")
	dup.Payload = []byte("other")
	write(t, ctx, env, dup, event(6, ""), event(6, ""))
	// No id: a random one.
	write(t, ctx, env, outbox.Event{Topic: "orders", Payload: nil})

	rows := listAll(t, ctx, b, outbox.StatePending)
	var ids []string
	for _, r := range rows {
		ids = append(ids, r.EventID)
	}
	if len(ids) != 5 || !slices.Equal(ids[:4], []string{"ev-00001", "ev-00002", "ev-00003", "ev-00006"}) {
		t.Fatalf("pending ids in write order = %v", ids)
	}
	if len(ids[4]) != 32 || strings.Trim(ids[4], "0123456789abcdef") != "" {
		t.Fatalf("generated id %q is not 32 hex digits", ids[4])
	}
	r := rows[0]
	if r.Topic != "orders" || r.Key != "a" || string(r.Payload) != `{"n":1}` || r.Headers["content-type"] != "application/json" ||
		r.State != outbox.StatePending || r.Attempts != 0 || r.CreatedAt.IsZero() || !r.FinishedAt.IsZero() {
		t.Fatalf("stored event = %+v", r)
	}
	if rows[4].Payload == nil || len(rows[4].Payload) != 0 || rows[4].Headers != nil {
		t.Fatalf("empty event stored as %+v", rows[4])
	}
	got, err := b.GetByEventID(ctx, "ev-00002")
	if err != nil || got.ID != rows[1].ID {
		t.Fatalf("GetByEventID = %+v, %v", got, err)
	}
	for _, id := range []string{"ev-00004", "ev-00005"} {
		if _, err := b.GetByEventID(ctx, id); !errors.Is(err, idem.ErrNotFound) {
			t.Fatalf("event %s of a rolled-back tx: %v", id, err)
		}
	}
	// A large batch goes in one call.
	evs := make([]outbox.Event, outbox.MaxBatch)
	for i := range evs {
		evs[i] = event(1000+i, "")
	}
	write(t, ctx, env, evs...)
	if n := stats(t, ctx, b)[outbox.StatePending].Count; n != 5+outbox.MaxBatch {
		t.Fatalf("pending = %d", n)
	}
}

func testWriteInvalid[Tx any](t *testing.T, env Env[Tx]) {
	ctx := ctxT(t)
	b := env.Backend
	big := event(1, "")
	big.Payload = make([]byte, outbox.MaxPayloadBytes+1)
	many := event(1, "")
	many.Headers = map[string]string{}
	for i := range outbox.MaxHeaders + 1 {
		many.Headers[fmt.Sprint("h", i)] = "v"
	}
	with := func(f func(e *outbox.Event)) outbox.Event {
		e := event(1, "")
		f(&e)
		return e
	}
	cases := map[string][]outbox.Event{
		"none":           {},
		"too many":       make([]outbox.Event, outbox.MaxBatch+1),
		"bad id":         {with(func(e *outbox.Event) { e.ID = "tab\tid" })},
		"long id":        {with(func(e *outbox.Event) { e.ID = strings.Repeat("i", outbox.MaxIDLen+1) })},
		"no topic":       {with(func(e *outbox.Event) { e.Topic = "" })},
		"long topic":     {with(func(e *outbox.Event) { e.Topic = strings.Repeat("t", outbox.MaxTopicLen+1) })},
		"bad topic utf8": {with(func(e *outbox.Event) { e.Topic = "\xff" })},
		"long key":       {with(func(e *outbox.Event) { e.Key = strings.Repeat("k", outbox.MaxKeyLen+1) })},
		"big payload":    {big},
		"many headers":   {many},
		"header name":    {with(func(e *outbox.Event) { e.Headers = map[string]string{"a b": "v"} })},
		"header value": {with(func(e *outbox.Event) {
			e.Headers = map[string]string{"a": strings.Repeat("v", outbox.MaxHeaderValueLen+1)}
		})},
		"authorization":   {with(func(e *outbox.Event) { e.Headers = map[string]string{"authorization": "Bearer x"} })},
		"cookie":          {with(func(e *outbox.Event) { e.Headers = map[string]string{"Cookie": "s=1"} })},
		"second is wrong": {event(1, ""), with(func(e *outbox.Event) { e.Topic = "" })},
	}
	for name, evs := range cases {
		// Validation happens before the transaction is touched, so the
		// transaction goes on and commits its other writes.
		var werr error
		err := env.InTx(ctx, func(ctx context.Context, tx Tx) error {
			werr = b.Write(ctx, tx, evs...)
			return b.Write(ctx, tx, event(len(name), "ok"))
		})
		if err != nil {
			t.Fatalf("%s: the transaction failed after a validation error: %v", name, err)
		}
		if !errors.Is(werr, idem.ErrInvalidConfig) && !errors.Is(werr, idem.ErrInvalidKey) {
			t.Errorf("%s: Write = %v, want a validation error", name, werr)
		}
	}
	rows := listAll(t, ctx, b, outbox.StatePending)
	for _, r := range rows {
		if r.Key != "ok" {
			t.Fatalf("an invalid event was stored: %+v", r)
		}
	}
	var nilTx Tx
	if err := b.Write(ctx, nilTx, event(1, "")); err == nil {
		t.Fatal("Write with a nil transaction succeeded")
	}
}

func testConcurrent[Tx any](t *testing.T, env Env[Tx]) {
	ctx := ctxT(t)
	const (
		producers = 8
		perProd   = 40
		relays    = 3
		workers   = 8
	)
	pub := newRecorder(nil)
	hooks := newOutcomes()
	var rs []*outbox.Relay
	for range relays {
		cfg := fastConfig(5)
		cfg.Workers, cfg.BatchSize, cfg.Hooks = workers, 7, []idem.Hook{hooks}
		rs = append(rs, newRelay(t, env.Backend, pub, cfg))
	}
	for _, r := range rs {
		if err := r.Start(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Producers commit while the relays run; every third transaction rolls
	// back after writing.
	var wg sync.WaitGroup
	l := newLedger()
	for p := range producers {
		wg.Go(func() {
			for i := range perProd {
				n := p*perProd + i
				evs := []outbox.Event{event(2*n, fmt.Sprint("k", n%5)), event(2*n+1, "")}
				if err := produce(ctx, env, l, evs, n%3 == 0); err != nil {
					t.Error(err)
					return
				}
				rs[n%relays].Notify()
			}
		})
	}
	wg.Wait()
	waitIdle(t, ctx, env.Backend)
	for _, r := range rs {
		if err := r.Stop(ctx); err != nil {
			t.Error(err)
		}
	}
	seen, marked := pub.counts(), hooks.get(idem.Processed)
	committed, rolledBk := l.committed, l.rolledBack
	for id := range committed {
		if seen[id] < 1 {
			t.Errorf("committed event %s never published", id)
		}
		if marked[id] != 1 {
			t.Errorf("committed event %s marked sent %d times, want 1", id, marked[id])
		}
	}
	for id := range rolledBk {
		if seen[id] != 0 {
			t.Errorf("event %s of a rolled-back transaction published %d times", id, seen[id])
		}
	}
	if len(seen) != len(committed) {
		t.Errorf("%d ids published, %d committed", len(seen), len(committed))
	}
	st := stats(t, ctx, env.Backend)
	if st[outbox.StateSent].Count != int64(len(committed)) || st[outbox.StateDead].Count != 0 {
		t.Errorf("stats %+v; %d committed", st, len(committed))
	}
	dups := 0
	for _, n := range seen {
		dups += n - 1
	}
	t.Logf("%d committed events, %d rolled back, %d relays x %d workers: %d duplicate publishes", len(committed), len(rolledBk), relays, workers, dups)
}

// ledger records which events the producers committed and which they
// rolled back.
type ledger struct {
	mu                    sync.Mutex
	committed, rolledBack map[string]bool
}

func newLedger() *ledger { return &ledger{committed: map[string]bool{}, rolledBack: map[string]bool{}} }

var errAbort = errors.New("outboxtest: abort")

// produce writes evs in one transaction of env, rolls it back after the
// write when abort, and records the outcome in l.
func produce[Tx any](ctx context.Context, env Env[Tx], l *ledger, evs []outbox.Event, abort bool) error {
	err := env.InTx(ctx, func(ctx context.Context, tx Tx) error {
		if err := env.Backend.Write(ctx, tx, evs...); err != nil {
			return err
		}
		if abort {
			return errAbort
		}
		return nil
	})
	if err != nil && !(abort && errors.Is(err, errAbort)) {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range evs {
		if abort {
			l.rolledBack[e.ID] = true
		} else {
			l.committed[e.ID] = true
		}
	}
	return nil
}

func testRetry[Tx any](t *testing.T, env Env[Tx]) {
	ctx := ctxT(t)
	writeN(t, ctx, env, 3, nil)
	var tries sync.Map
	pub := newRecorder(func(m outbox.Message) error {
		n, _ := tries.LoadOrStore(m.ID, new(atomic.Int32))
		if n.(*atomic.Int32).Add(1) <= 2 && m.ID == "ev-00001" {
			return fmt.Errorf("broker said no (attempt %d)", m.Attempt)
		}
		return nil
	})
	hooks := newOutcomes()
	cfg := fastConfig(5)
	cfg.Hooks = []idem.Hook{hooks}
	drain(t, ctx, env.Backend, newRelay(t, env.Backend, pub, cfg))
	r, err := env.Backend.GetByEventID(ctx, "ev-00001")
	if err != nil {
		t.Fatal(err)
	}
	if r.State != outbox.StateSent || r.Attempts != 2 || !strings.Contains(r.LastError, "attempt 2") || r.FinishedAt.IsZero() || r.LastAttemptAt.IsZero() {
		t.Fatalf("retried event = %+v", r)
	}
	var attempts []int
	for _, m := range pub.all {
		if m.ID == "ev-00001" {
			attempts = append(attempts, m.Attempt)
		}
	}
	if !slices.Equal(attempts, []int{3}) || hooks.get(idem.Retried)["ev-00001"] != 2 || hooks.get(idem.Processed)["ev-00001"] != 1 {
		t.Fatalf("confirmed attempts %v, outcomes %v", attempts, hooks.by)
	}
}

func testMaxAttempts[Tx any](t *testing.T, env Env[Tx]) {
	ctx := ctxT(t)
	writeN(t, ctx, env, 2, nil)
	pub := newRecorder(func(m outbox.Message) error {
		if m.ID == "ev-00000" {
			return fmt.Errorf("publish: %w", errors.New("queue is full"))
		}
		return nil
	})
	hooks := newOutcomes()
	cfg := fastConfig(3)
	cfg.Hooks = []idem.Hook{hooks}
	drain(t, ctx, env.Backend, newRelay(t, env.Backend, pub, cfg))
	r := onlyRow(t, ctx, env.Backend, outbox.StateDead)
	if r.EventID != "ev-00000" || r.Attempts != 3 || r.DeadReason != idem.DeadMaxAttempts || !strings.HasPrefix(r.LastError, "queue is full") ||
		r.FinishedAt.IsZero() || r.CreatedAt.After(r.FinishedAt) {
		t.Fatalf("dead event = %+v", r)
	}
	if hooks.get(idem.DeadLettered)["ev-00000"] != 1 || hooks.get(idem.Retried)["ev-00000"] != 2 {
		t.Fatalf("outcomes %v", hooks.by)
	}
}

func testPermanent[Tx any](t *testing.T, env Env[Tx]) {
	ctx := ctxT(t)
	writeN(t, ctx, env, 2, nil)
	pub := newRecorder(func(m outbox.Message) error {
		if m.ID == "ev-00001" {
			return errors.Join(errors.New("unroutable"), outbox.PermanentError(errors.New("no queue bound")))
		}
		return nil
	})
	drain(t, ctx, env.Backend, newRelay(t, env.Backend, pub, fastConfig(5)))
	r := onlyRow(t, ctx, env.Backend, outbox.StateDead)
	if r.EventID != "ev-00001" || r.Attempts != 1 || r.DeadReason != idem.DeadPermanent {
		t.Fatalf("dead event = %+v", r)
	}
}

func testUncounted[Tx any](t *testing.T, env Env[Tx]) {
	ctx := ctxT(t)
	writeN(t, ctx, env, 1, nil)
	var n atomic.Int32
	pub := newRecorder(func(outbox.Message) error {
		if n.Add(1) <= 3 {
			return idem.Retryable(errors.New("connection refused"))
		}
		return nil
	})
	drain(t, ctx, env.Backend, newRelay(t, env.Backend, pub, fastConfig(2)))
	r := onlyRow(t, ctx, env.Backend, outbox.StateSent)
	if r.Attempts != 0 || !strings.Contains(r.LastError, "connection refused") {
		t.Fatalf("event after 3 infrastructure failures and MaxAttempts 2 = %+v", r)
	}
}

func testBadPublisher[Tx any](t *testing.T, env Env[Tx]) {
	ctx := ctxT(t)
	writeN(t, ctx, env, 4, nil)
	// A batch with a first attempt in it panics, one with a second
	// attempt gets one result too many, any other is confirmed.
	pub := outbox.PublisherFunc(func(_ context.Context, msgs []outbox.Message) []error {
		for _, m := range msgs {
			if m.Attempt == 1 {
				panic("publisher bug")
			}
		}
		for _, m := range msgs {
			if m.Attempt == 2 {
				return make([]error, len(msgs)+1)
			}
		}
		return nil
	})
	cfg := fastConfig(10)
	cfg.Workers, cfg.BatchSize = 2, 10
	drain(t, ctx, env.Backend, newRelay(t, env.Backend, pub, cfg))
	for _, r := range listAll(t, ctx, env.Backend, outbox.StateSent) {
		if r.Attempts < 2 || !strings.Contains(r.LastError, "results for") && !strings.Contains(r.LastError, "panicked") {
			t.Fatalf("event after a panic and a bad result = %+v", r)
		}
	}
	if n := stats(t, ctx, env.Backend)[outbox.StateSent].Count; n != 4 {
		t.Fatalf("sent = %d", n)
	}
}

func testFencing[Tx any](t *testing.T, env Env[Tx]) {
	ctx := ctxT(t)
	b := env.Backend
	writeN(t, ctx, env, 2, nil)
	held, err := b.Claim(ctx, outboxdriver.ClaimRequest{Limit: 10, Lease: time.Minute})
	if err != nil || len(held) != 2 || held[0].State != outbox.StateSending || held[0].LeaseExpiresAt.IsZero() || held[0].Token == 0 {
		t.Fatalf("claim = %+v, %v", held, err)
	}
	if again, err := b.Claim(ctx, outboxdriver.ClaimRequest{Limit: 10, Lease: time.Second}); err != nil || len(again) != 0 {
		t.Fatalf("claim of leased events = %+v, %v", again, err)
	}
	if n, err := b.Release(ctx, []outboxdriver.Lease{held[0].Lease(), held[1].Lease()}); err != nil || n != 2 {
		t.Fatalf("Release = %d, %v", n, err)
	}
	first, err := b.Claim(ctx, outboxdriver.ClaimRequest{Limit: 10, Lease: 50 * time.Millisecond})
	if err != nil || len(first) != 2 || first[0].Token <= held[1].Token {
		t.Fatalf("claim after release = %+v, %v", first, err)
	}
	var second []outbox.Row
	for len(second) < 2 {
		time.Sleep(60 * time.Millisecond)
		more, err := b.Claim(ctx, outboxdriver.ClaimRequest{Limit: 10, Lease: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		second = append(second, more...)
	}
	if second[0].Token <= first[0].Token && second[0].Token <= first[1].Token {
		t.Fatalf("takeover tokens %d, %d not above %d, %d", second[0].Token, second[1].Token, first[0].Token, first[1].Token)
	}
	stale := []outboxdriver.Lease{first[0].Lease(), first[1].Lease()}
	if ids, err := b.MarkSent(ctx, stale); err != nil || len(ids) != 0 {
		t.Fatalf("MarkSent with stale tokens = %v, %v", ids, err)
	}
	if ids, err := b.Fail(ctx, []outboxdriver.FailRequest{{Lease: stale[0], Error: "x"}}); err != nil || len(ids) != 0 {
		t.Fatalf("Fail with a stale token = %v, %v", ids, err)
	}
	if n, err := b.Release(ctx, stale); err != nil || n != 0 {
		t.Fatalf("Release with stale tokens = %d, %v", n, err)
	}
	byID := map[int64]outbox.Row{}
	for _, r := range second {
		byID[r.ID] = r
	}
	r0, r1 := byID[first[0].ID], byID[first[1].ID]
	if ids, err := b.MarkSent(ctx, []outboxdriver.Lease{r0.Lease()}); err != nil || !slices.Equal(ids, []int64{r0.ID}) {
		t.Fatalf("MarkSent = %v, %v", ids, err)
	}
	if ids, err := b.MarkSent(ctx, []outboxdriver.Lease{r0.Lease()}); err != nil || len(ids) != 0 {
		t.Fatalf("second MarkSent = %v, %v", ids, err)
	}
	if n, err := b.Release(ctx, []outboxdriver.Lease{r1.Lease()}); err != nil || n != 1 {
		t.Fatalf("Release = %d, %v", n, err)
	}
	got, err := b.Get(ctx, r1.ID)
	if err != nil || got.State != outbox.StatePending || got.Attempts != 0 {
		t.Fatalf("released event = %+v, %v", got, err)
	}
	// Nothing to do is no error.
	if ids, err := b.MarkSent(ctx, nil); err != nil || ids != nil {
		t.Fatalf("MarkSent(nil) = %v, %v", ids, err)
	}
	if ids, err := b.Fail(ctx, nil); err != nil || ids != nil {
		t.Fatalf("Fail(nil) = %v, %v", ids, err)
	}
	if n, err := b.Release(ctx, nil); err != nil || n != 0 {
		t.Fatalf("Release(nil) = %d, %v", n, err)
	}
}

func testOrdered[Tx any](t *testing.T, env Env[Tx]) {
	ctx := ctxT(t)
	const n = 60
	writeN(t, ctx, env, n, func(i int) string {
		if i%6 == 5 {
			return ""
		}
		return fmt.Sprint("key-", i%4)
	})
	var (
		inFlight sync.Map // key -> *atomic.Int32
		overlap  atomic.Int32
		fails    sync.Map
	)
	base := newRecorder(nil)
	pub := outbox.PublisherFunc(func(ctx context.Context, msgs []outbox.Message) []error {
		errs := make([]error, len(msgs))
		for _, m := range msgs {
			if m.Key == "" {
				continue
			}
			c, _ := inFlight.LoadOrStore(m.Key, new(atomic.Int32))
			if c.(*atomic.Int32).Add(1) > 1 {
				overlap.Add(1)
			}
		}
		time.Sleep(time.Millisecond)
		for i, m := range msgs {
			// Every fifth event fails once: its key must wait for it.
			if _, again := fails.LoadOrStore(m.ID, true); !again && i%5 == 0 {
				errs[i] = errors.New("transient")
			}
		}
		for i, m := range msgs {
			if errs[i] == nil {
				base.Publish(ctx, []outbox.Message{m})
			}
			if m.Key != "" {
				c, _ := inFlight.Load(m.Key)
				c.(*atomic.Int32).Add(-1)
			}
		}
		return errs
	})
	cfg := fastConfig(10)
	cfg.Ordered, cfg.Workers, cfg.BatchSize = true, 6, 4
	drain(t, ctx, env.Backend, newRelay(t, env.Backend, pub, cfg))
	if overlap.Load() != 0 {
		t.Errorf("%d publishes overlapped another of the same key", overlap.Load())
	}
	last := map[string]string{}
	for _, m := range base.all {
		if m.Key == "" {
			continue
		}
		if m.ID <= last[m.Key] {
			t.Fatalf("key %s: %s published after %s", m.Key, m.ID, last[m.Key])
		}
		last[m.Key] = m.ID
	}
	if len(base.counts()) != n {
		t.Fatalf("published %d of %d", len(base.counts()), n)
	}
}

func testDeadHoldsKey[Tx any](t *testing.T, env Env[Tx]) {
	ctx := ctxT(t)
	b := env.Backend
	write(t, ctx, env, event(1, "k"), event(2, "k"), event(3, "other"))
	var failed atomic.Bool
	pub := newRecorder(func(m outbox.Message) error {
		if m.ID == "ev-00001" && !failed.Swap(true) {
			return outbox.PermanentError(errors.New("too large"))
		}
		return nil
	})
	cfg := fastConfig(5)
	cfg.Ordered = true
	r := newRelay(t, b, pub, cfg)
	for range 3 {
		if _, err := r.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if c := pub.counts(); c["ev-00002"] != 0 || c["ev-00003"] != 1 {
		t.Fatalf("published %v: the event after a dead one of its key went out", c)
	}
	if st := stats(t, ctx, b); st[outbox.StatePending].Count != 1 || st[outbox.StateDead].Count != 1 {
		t.Fatalf("stats %+v", st)
	}
	dead := onlyRow(t, ctx, b, outbox.StateDead)
	if n, err := b.Redrive(ctx, outbox.Select{IDs: []int64{dead.ID}}); err != nil || n != 1 {
		t.Fatalf("Redrive = %d, %v", n, err)
	}
	for range 3 {
		if _, err := r.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var order []string
	for _, m := range pub.all {
		if m.Key == "k" {
			order = append(order, m.ID)
		}
	}
	if !slices.Equal(order, []string{"ev-00001", "ev-00002"}) {
		t.Fatalf("key k published in order %v", order)
	}
}

func testHardStop[Tx any](t *testing.T, env Env[Tx]) {
	ctx := ctxT(t)
	writeN(t, ctx, env, 3, nil)
	entered := make(chan struct{}, 1)
	pub := outbox.PublisherFunc(func(ctx context.Context, msgs []outbox.Message) []error {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-ctx.Done()
		errs := make([]error, len(msgs))
		for i := range errs {
			errs[i] = ctx.Err()
		}
		return errs
	})
	cfg := fastConfig(5)
	cfg.Workers, cfg.BatchSize = 1, 10
	r := newRelay(t, env.Backend, pub, cfg)
	runCtx, cancel := context.WithCancel(ctx)
	if err := r.Start(runCtx); err != nil {
		t.Fatal(err)
	}
	<-entered
	stopCtx, stopCancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer stopCancel()
	if err := r.Stop(stopCtx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop past its deadline = %v", err)
	}
	cancel()
	for _, row := range listAll(t, ctx, env.Backend, outbox.StatePending) {
		if row.Attempts != 0 {
			t.Fatalf("event given back on a hard stop = %+v", row)
		}
	}
	if n := stats(t, ctx, env.Backend)[outbox.StatePending].Count; n != 3 {
		t.Fatalf("pending after a hard stop = %d, want 3", n)
	}
	if err := r.Start(ctx); err == nil {
		t.Fatal("a relay started twice")
	}
}

func testPurge[Tx any](t *testing.T, env Env[Tx]) {
	ctx := ctxT(t)
	writeN(t, ctx, env, 7, nil)
	cfg := fastConfig(5)
	cfg.Retention, cfg.PurgeBatch = time.Hour, 2
	r := newRelay(t, env.Backend, newRecorder(nil), cfg)
	drain(t, ctx, env.Backend, r)
	write(t, ctx, env, event(100, ""))
	if n, err := r.Purge(ctx); err != nil || n != 0 {
		t.Fatalf("purge within the retention = %d, %v", n, err)
	}
	time.Sleep(5 * time.Millisecond)
	if n, err := env.Backend.PurgeSent(ctx, time.Millisecond, 2); err != nil || n != 7 {
		t.Fatalf("PurgeSent = %d, %v; want 7 in batches of 2", n, err)
	}
	if st := stats(t, ctx, env.Backend); st[outbox.StateSent].Count != 0 || st[outbox.StatePending].Count != 1 {
		t.Fatalf("stats after purge %+v", st)
	}
}

func testAdmin[Tx any](t *testing.T, env Env[Tx]) {
	ctx := ctxT(t)
	b := env.Backend
	writeN(t, ctx, env, 12, nil)
	var healed atomic.Bool
	pub := newRecorder(func(m outbox.Message) error {
		if !healed.Load() && m.ID < "ev-00005" {
			return outbox.PermanentError(fmt.Errorf("refused %s", m.ID))
		}
		return nil
	})
	relay := newRelay(t, b, pub, fastConfig(5))
	drain(t, ctx, b, relay)
	st := stats(t, ctx, b)
	if st[outbox.StateDead].Count != 5 || st[outbox.StateSent].Count != 7 || st[outbox.StateDead].Oldest <= 0 {
		t.Fatalf("stats %+v", st)
	}
	dead := listAll(t, ctx, b, outbox.StateDead)
	if len(dead) != 5 || dead[0].EventID != "ev-00000" || dead[0].LastError != "refused ev-00000" {
		t.Fatalf("dead = %+v", dead)
	}
	page, err := b.List(ctx, outbox.ListRequest{State: outbox.StateDead, AfterID: dead[1].ID, Limit: 2})
	if err != nil || len(page) != 2 || page[0].ID != dead[2].ID {
		t.Fatalf("page after %d = %+v, %v", dead[1].ID, page, err)
	}
	got, err := b.Get(ctx, dead[0].ID)
	if err != nil || got.EventID != "ev-00000" || got.DeadReason != idem.DeadPermanent {
		t.Fatalf("Get = %+v, %v", got, err)
	}
	if _, err := b.Get(ctx, 1<<40); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("Get of a missing row = %v", err)
	}
	if _, err := b.GetByEventID(ctx, "nope"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("GetByEventID of a missing event = %v", err)
	}
	// Only dead events are redriven or discarded.
	sent := listAll(t, ctx, b, outbox.StateSent)
	if n, err := b.Redrive(ctx, outbox.Select{IDs: []int64{sent[0].ID}}); err != nil || n != 0 {
		t.Fatalf("Redrive of a sent event = %d, %v", n, err)
	}
	if n, err := b.Discard(ctx, outbox.Select{IDs: []int64{sent[0].ID, dead[0].ID}}); err != nil || n != 1 {
		t.Fatalf("Discard = %d, %v", n, err)
	}
	if n, err := b.Redrive(ctx, outbox.Select{IDs: []int64{dead[1].ID}}); err != nil || n != 1 {
		t.Fatalf("Redrive = %d, %v", n, err)
	}
	r, err := b.Get(ctx, dead[1].ID)
	if err != nil || r.State != outbox.StatePending || r.Attempts != 0 || r.DeadReason != "" || !r.FinishedAt.IsZero() || r.LastError == "" {
		t.Fatalf("redriven = %+v, %v", r, err)
	}
	healed.Store(true)
	if n, err := b.Redrive(ctx, outbox.Select{All: true}); err != nil || n != 3 {
		t.Fatalf("Redrive all = %d, %v", n, err)
	}
	drain(t, ctx, b, newRelay(t, b, pub, fastConfig(5)))
	if st := stats(t, ctx, b); st[outbox.StateSent].Count != 11 || st[outbox.StateDead].Count != 0 {
		t.Fatalf("stats after redrive %+v", st)
	}
	if n, err := b.Discard(ctx, outbox.Select{All: true}); err != nil || n != 0 {
		t.Fatalf("Discard all with no dead = %d, %v", n, err)
	}
}

func testInvalid[Tx any](t *testing.T, env Env[Tx]) {
	ctx := ctxT(t)
	b := env.Backend
	invalid := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("%s: %v, want idem.ErrInvalidConfig", what, err)
		}
	}
	_, err := b.Claim(ctx, outboxdriver.ClaimRequest{Limit: 0, Lease: time.Second})
	invalid("claim limit 0", err)
	_, err = b.Claim(ctx, outboxdriver.ClaimRequest{Limit: outbox.MaxBatch + 1, Lease: time.Second})
	invalid("claim limit too big", err)
	_, err = b.Claim(ctx, outboxdriver.ClaimRequest{Limit: 1})
	invalid("claim without lease", err)
	_, err = b.List(ctx, outbox.ListRequest{State: outbox.StateDead, Limit: -1})
	invalid("list limit", err)
	_, err = b.List(ctx, outbox.ListRequest{State: "lost"})
	invalid("list state", err)
	_, err = b.PurgeSent(ctx, -time.Second, 0)
	invalid("purge negative", err)
	_, err = b.PurgeSent(ctx, 0, outbox.MaxBatch+1)
	invalid("purge limit", err)
	_, err = b.Redrive(ctx, outbox.Select{})
	invalid("redrive nothing", err)
	_, err = b.Discard(ctx, outbox.Select{All: true, IDs: []int64{1}})
	invalid("discard both", err)
	_, err = b.Redrive(ctx, outbox.Select{IDs: make([]int64, outbox.MaxBatch+1)})
	invalid("redrive too many", err)
	pub := newRecorder(nil)
	for name, cfg := range map[string]*outbox.Config{
		"workers":         {Workers: -1},
		"batch":           {BatchSize: outbox.MaxBatch + 1},
		"lease":           {Lease: time.Millisecond},
		"publish timeout": {Lease: time.Second, PublishTimeout: time.Second},
		"poll":            {PollInterval: -1},
		"purge batch":     {PurgeBatch: -1},
	} {
		_, err := outbox.NewRelay(b, pub, cfg)
		invalid("config "+name, err)
	}
	_, err = outbox.NewRelay(nil, pub, nil)
	invalid("nil driver", err)
	_, err = outbox.NewRelay(b, nil, nil)
	invalid("nil publisher", err)
	r, err := outbox.NewRelay(b, pub, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c := r.Config(); c.Workers != outbox.DefaultWorkers || c.PublishTimeout != outbox.DefaultLease/2 || c.Retention != outbox.DefaultRetention {
		t.Fatalf("defaults = %+v", c)
	}
	if err := r.Stop(ctx); err != nil {
		t.Fatalf("Stop before Start = %v", err)
	}
}
