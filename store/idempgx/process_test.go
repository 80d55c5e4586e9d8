package idempgx_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

func (e *processEnv) mustEffects(t *testing.T) map[string]int {
	t.Helper()
	m, err := e.Effects(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestProcessSingle(t *testing.T) {
	t.Parallel()
	e := newProcessEnv(t)
	ctx := ctxT(t)
	msg := idem.Message{Scope: "orders", Key: "o-1", Fingerprint: fp("v1")}

	boom := errors.New("boom")
	if res, err := e.Process(ctx, msg, boom); !errors.Is(err, boom) || res != "" {
		t.Fatalf("failing handler = %v, %v; want its error", res, err)
	}
	if n := e.mustEffects(t)["o-1"]; n != 0 {
		t.Fatalf("failed handler left %d effects", n)
	}
	if _, err := e.s.Get(ctx, "orders", "o-1"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("failed handler left a dedupe record: %v", err)
	}
	for i, want := range []idem.Outcome{idem.Processed, idem.Duplicate, idem.Duplicate} {
		if res, err := e.Process(ctx, msg, nil); err != nil || res != want {
			t.Fatalf("delivery %d = %v, %v; want %v", i, res, err, want)
		}
	}
	changed := msg
	changed.Fingerprint = fp("v2")
	res, err := e.Process(ctx, changed, nil)
	if res != idem.Mismatch || !errors.Is(err, idem.ErrFingerprintMismatch) {
		t.Fatalf("changed content = %v, %v; want Mismatch", res, err)
	}
	if n := e.mustEffects(t)["o-1"]; n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
	rec, err := e.s.Get(ctx, "orders", "o-1")
	if err != nil || rec.State != idem.StateCompleted || time.Until(rec.ExpiresAt) < 23*time.Hour {
		t.Fatalf("dedupe record = %+v, %v; want completed with the default retention", rec, err)
	}
}

func TestProcessRetentionWindow(t *testing.T) {
	t.Parallel()
	e := newProcessEnv(t)
	ctx := ctxT(t)
	// The window leaves a busy machine room for the duplicate inside it: at
	// 30ms, the second call came after the window now and then under -race.
	msg := idem.Message{Key: "w", Retention: time.Second}
	if res, err := e.Process(ctx, msg, nil); err != nil || res != idem.Processed {
		t.Fatal(res, err)
	}
	if res, err := e.Process(ctx, msg, nil); err != nil || res != idem.Duplicate {
		t.Fatal(res, err)
	}
	time.Sleep(1200 * time.Millisecond)
	// After the window, the same message runs again (and other content is new).
	msg.Fingerprint = fp("other")
	if res, err := e.Process(ctx, msg, nil); err != nil || res != idem.Processed {
		t.Fatalf("after the window = %v, %v; want Processed", res, err)
	}
	if n := e.mustEffects(t)["w"]; n != 2 {
		t.Fatalf("effects = %d, want 2", n)
	}
}

func TestProcessConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	e := newProcessEnv(t)
	ctx := ctxT(t)
	const workers = 24
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		counts = map[idem.Outcome]int{}
	)
	for range workers {
		wg.Go(func() {
			res, err := e.s.Process(ctx, idem.Message{Key: "pay-1", Fingerprint: fp("p")}, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, "INSERT INTO "+e.effects+" (key) VALUES ('pay-1')")
				time.Sleep(5 * time.Millisecond) // keep the row lock while others arrive
				return err
			})
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			counts[res]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if counts[idem.Processed] != 1 || counts[idem.Duplicate] != workers-1 {
		t.Fatalf("results %v; want 1 processed and %d duplicates", counts, workers-1)
	}
	if n := e.mustEffects(t)["pay-1"]; n != 1 {
		t.Fatalf("effects = %d, want exactly 1", n)
	}
}

func TestProcessGuardLease(t *testing.T) {
	t.Parallel()
	e := newProcessEnv(t)
	ctx := ctxT(t)
	c, err := e.s.Claim(ctx, idem.ClaimRequest{Key: "g", Fingerprint: fp("g"), Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	msg := idem.Message{Key: "g", Fingerprint: fp("g")}
	if _, err := e.Process(ctx, msg, nil); !errors.Is(err, idem.ErrInProgress) {
		t.Fatalf("process of a key under a live lease = %v; want ErrInProgress", err)
	}
	if _, err := e.ProcessBatch(ctx, []idem.Message{{Key: "other"}, msg}, nil); !errors.Is(err, idem.ErrInProgress) {
		t.Fatalf("batch with a key under a live lease = %v; want ErrInProgress", err)
	}
	if n := len(e.mustEffects(t)); n != 0 {
		t.Fatalf("effects %v; want none", e.mustEffects(t))
	}
	// Once the lease expires, Process takes the key over.
	if _, err := e.s.Extend(ctx, "", "g", c.Token, time.Microsecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	if res, err := e.Process(ctx, msg, nil); err != nil || res != idem.Processed {
		t.Fatalf("process after the lease expired = %v, %v", res, err)
	}
	// And so does ProcessBatch: its first pass leaves existing rows alone,
	// the next one takes the expired lease over.
	c2, err := e.s.Claim(ctx, idem.ClaimRequest{Key: "g2", Fingerprint: fp("g2"), Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Extend(ctx, "", "g2", c2.Token, time.Microsecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	res, err := e.ProcessBatch(ctx, []idem.Message{{Key: "g2", Fingerprint: fp("g2")}, {Key: "g"}}, nil)
	if err != nil || len(res) != 2 || res[0] != idem.Processed || res[1] != idem.Mismatch {
		t.Fatalf("batch after the lease expired = %v, %v; want [processed mismatched]", res, err)
	}
}

func TestProcessBatch(t *testing.T) {
	t.Parallel()
	e := newProcessEnv(t)
	ctx := ctxT(t)
	if res, err := e.Process(ctx, idem.Message{Key: "seen", Fingerprint: fp("s")}, nil); err != nil || res != idem.Processed {
		t.Fatal(res, err)
	}
	if res, err := e.Process(ctx, idem.Message{Key: "taken", Fingerprint: fp("t")}, nil); err != nil || res != idem.Processed {
		t.Fatal(res, err)
	}
	msgs := []idem.Message{
		{Key: "b", Fingerprint: fp("b")},
		{Key: "seen", Fingerprint: fp("s")},           // Duplicate of an earlier delivery
		{Key: "a", Fingerprint: fp("a")},              // fresh
		{Key: "b", Fingerprint: fp("b")},              // repeated within the batch
		{Key: "b", Fingerprint: fp("B")},              // repeated with other content
		{Key: "taken", Fingerprint: fp("x")},          // key reused with other content
		{Key: "taken", Fingerprint: fp("t")},          // the stored content: Duplicate
		{Scope: "s2", Key: "a", Fingerprint: fp("z")}, // same key, other scope: fresh
	}
	var handed []int
	res, err := e.s.ProcessBatch(ctx, msgs, func(ctx context.Context, tx pgx.Tx, fresh []int) error {
		handed = fresh
		for _, i := range fresh {
			if _, err := tx.Exec(ctx, "INSERT INTO "+e.effects+" (key) VALUES ($1)", msgs[i].Scope+"/"+msgs[i].Key); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []idem.Outcome{idem.Processed, idem.Duplicate, idem.Processed, idem.Duplicate, idem.Mismatch, idem.Mismatch, idem.Duplicate, idem.Processed}
	if fmt.Sprint(res) != fmt.Sprint(want) {
		t.Fatalf("results %v\nwant    %v", res, want)
	}
	if fmt.Sprint(handed) != "[0 2 7]" {
		t.Fatalf("handler got %v, want [0 2 7]", handed)
	}
	// The whole batch again: nothing is fresh and the handler is not called.
	res, err = e.s.ProcessBatch(ctx, msgs[:4], func(context.Context, pgx.Tx, []int) error {
		t.Error("handler called without fresh messages")
		return nil
	})
	if err != nil || fmt.Sprint(res) != fmt.Sprint([]idem.Outcome{idem.Duplicate, idem.Duplicate, idem.Duplicate, idem.Duplicate}) {
		t.Fatalf("redelivered batch = %v, %v", res, err)
	}
	if res, err := e.s.ProcessBatch(ctx, nil, func(context.Context, pgx.Tx, []int) error { return nil }); err != nil || res != nil {
		t.Fatalf("empty batch = %v, %v", res, err)
	}
}

func TestProcessBatchHandlerErrorRollsBack(t *testing.T) {
	t.Parallel()
	e := newProcessEnv(t)
	ctx := ctxT(t)
	msgs := []idem.Message{{Key: "x"}, {Key: "y"}}
	boom := errors.New("boom")
	if res, err := e.ProcessBatch(ctx, msgs, boom); !errors.Is(err, boom) || res != nil {
		t.Fatalf("failing batch = %v, %v", res, err)
	}
	if len(e.mustEffects(t)) != 0 {
		t.Fatal("failed batch left effects")
	}
	res, err := e.ProcessBatch(ctx, msgs, nil)
	if err != nil || res[0] != idem.Processed || res[1] != idem.Processed {
		t.Fatalf("redelivery after failure = %v, %v; want both processed", res, err)
	}
}

func TestProcessBatchConcurrentOverlapping(t *testing.T) {
	t.Parallel()
	e := newProcessEnv(t)
	ctx := ctxT(t)
	// 12 consumers each get the same 40 keys in a different order: without
	// a common lock order they would deadlock; with it each key has one effect.
	const consumers, keys = 12, 40
	var wg sync.WaitGroup
	for c := range consumers {
		wg.Go(func() {
			msgs := make([]idem.Message, keys)
			for i := range keys {
				msgs[i] = idem.Message{Key: fmt.Sprintf("k%02d", (i*7+c*13)%keys)}
			}
			if _, err := e.ProcessBatch(ctx, msgs, nil); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	got := e.mustEffects(t)
	if len(got) != keys {
		t.Fatalf("%d keys have effects, want %d", len(got), keys)
	}
	for k, n := range got {
		if n != 1 {
			t.Errorf("key %s has %d effects", k, n)
		}
	}
}

func TestProcessInvalidInput(t *testing.T) {
	t.Parallel()
	s, err := idempgx.New(testPool(t), &idempgx.Config{Schema: "idem_does_not_exist"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	ok := func(context.Context, pgx.Tx) error { return nil }
	okBatch := func(context.Context, pgx.Tx, []int) error { return nil }
	if _, err := s.Process(ctx, idem.Message{Key: ""}, ok); !errors.Is(err, idem.ErrInvalidKey) {
		t.Errorf("empty key: %v", err)
	}
	if _, err := s.Process(ctx, idem.Message{Key: "k", Retention: -time.Second}, ok); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("negative retention: %v", err)
	}
	if _, err := s.Process(ctx, idem.Message{Key: "k"}, nil); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("nil handler: %v", err)
	}
	if _, err := s.ProcessBatch(ctx, []idem.Message{{Key: "k"}, {Key: "bad\x00"}}, okBatch); !errors.Is(err, idem.ErrInvalidKey) {
		t.Errorf("batch with bad key: %v", err)
	}
	if _, err := s.ProcessBatch(ctx, []idem.Message{{Key: "k"}}, nil); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("batch with nil handler: %v", err)
	}
	if _, err := s.ProcessBatch(ctx, make([]idem.Message, idempgx.MaxBatch+1), okBatch); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("oversized batch: %v", err)
	}
	if _, err := s.Process(ctx, idem.Message{Key: "k"}, ok); !errors.Is(err, idempgx.ErrNotMigrated) {
		t.Errorf("process on unmigrated schema: %v", err)
	}
}

func TestProcessCommitFailureIsReported(t *testing.T) {
	t.Parallel()
	e := newProcessEnv(t)
	ctx := ctxT(t)
	// A deferred constraint fails at commit: the server answered, so the
	// error is not retryable and nothing was recorded.
	if _, err := e.s.Pool().Exec(ctx, "CREATE TABLE "+qualified(e.s, "deferred")+" (id int UNIQUE DEFERRABLE INITIALLY DEFERRED)"); err != nil {
		t.Fatal(err)
	}
	_, err := e.s.Process(ctx, idem.Message{Key: "d"}, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+qualified(e.s, "deferred")+" VALUES (1), (1)")
		return err
	})
	if err == nil || idem.IsRetryable(err) {
		t.Fatalf("commit with a deferred violation = %v; want a non-retryable error", err)
	}
	if _, err := e.s.Get(ctx, "", "d"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("failed commit left a record: %v", err)
	}
}

func TestProcessHandlerPanicReleasesConnection(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig(databaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1 // a leaked connection would block the next Process
	own, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	s, _ := idempgx.New(own, &idempgx.Config{Schema: migratedSchema(t)})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the handler's panic did not propagate")
			}
		}()
		_, _ = s.Process(ctx, idem.Message{Key: "p"}, func(context.Context, pgx.Tx) error { panic("handler bug") })
	}()
	res, err := s.Process(ctx, idem.Message{Key: "p"}, func(context.Context, pgx.Tx) error { return nil })
	if err != nil || res != idem.Processed {
		t.Fatalf("process after a panic = %v, %v; want Processed (the panicking attempt recorded nothing)", res, err)
	}
}

func TestProcessTxInCallersTransaction(t *testing.T) {
	t.Parallel()
	e := newProcessEnv(t)
	ctx := ctxT(t)
	run := func(fn func(tx pgx.Tx) error) {
		t.Helper()
		if err := pgx.BeginFunc(ctx, e.s.Pool(), fn); err != nil {
			t.Fatal(err)
		}
	}
	msg := idem.Message{Scope: "tx", Key: "one", Fingerprint: fp("1")}
	for i, want := range []idem.Outcome{idem.Processed, idem.Duplicate} {
		run(func(tx pgx.Tx) error {
			res, err := e.s.ProcessTx(ctx, tx, msg)
			if err != nil || res != want {
				t.Fatalf("ProcessTx %d = %v, %v; want %v", i, res, err, want)
			}
			if res == idem.Processed {
				_, err = tx.Exec(ctx, "INSERT INTO "+e.effects+" (key) VALUES ('one')")
			}
			return err
		})
	}
	// A caller's rollback takes the dedupe record with it.
	tx, err := e.s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := e.s.ProcessTx(ctx, tx, idem.Message{Scope: "tx", Key: "rolled-back"}); err != nil || res != idem.Processed {
		t.Fatal(res, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	msgs := []idem.Message{{Scope: "tx", Key: "rolled-back"}, msg, {Scope: "tx", Key: "one", Fingerprint: fp("2")}}
	run(func(tx pgx.Tx) error {
		res, err := e.s.ProcessBatchTx(ctx, tx, msgs)
		want := []idem.Outcome{idem.Processed, idem.Duplicate, idem.Mismatch}
		if err != nil || fmt.Sprint(res) != fmt.Sprint(want) {
			t.Fatalf("ProcessBatchTx = %v, %v; want %v", res, err, want)
		}
		return nil
	})
	if _, err := e.s.Get(ctx, "tx", "rolled-back"); err != nil {
		t.Fatalf("batch record not committed: %v", err)
	}
	if n := e.mustEffects(t)["one"]; n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
}

// TestProcessRecordsHoldNoToken: a dedupe record written by Process or
// ProcessBatch, fresh or over an expired lease, holds no fencing token (0,
// as in the other stores), the lease it replaced is lost to its holder, and
// a later Claim of the key still draws a token above every token issued.
func TestProcessRecordsHoldNoToken(t *testing.T) {
	t.Parallel()
	for _, layout := range []struct {
		name string
		new  func(testing.TB, *idempgx.Config) *idempgx.Store
	}{{"plain", newStore}, {"partitioned", newPartitionedStore}} {
		t.Run(layout.name, func(t *testing.T) {
			t.Parallel()
			e := newProcessEnvOn(t, layout.new(t, nil))
			ctx := ctxT(t)
			wantToken := func(key string, want int64, why string) {
				t.Helper()
				rec, err := e.s.Get(ctx, "", key)
				if err != nil || rec.State != idem.StateCompleted || rec.Token != want {
					t.Fatalf("%s: record %q = %+v, %v; want completed with token %d", why, key, rec, err, want)
				}
			}
			// Two expired leases, for Process and ProcessBatch to take over.
			var held []idem.Claim
			for _, key := range []string{"g1", "g2"} {
				c, err := e.s.Claim(ctx, idem.ClaimRequest{Key: key, Fingerprint: fp(key), Lease: time.Minute})
				if err != nil || c.Outcome != idem.Acquired || c.Token <= 0 {
					t.Fatalf("claim %q = %+v, %v", key, c, err)
				}
				if _, err := e.s.Extend(ctx, "", key, c.Token, time.Microsecond); err != nil {
					t.Fatal(err)
				}
				held = append(held, c)
			}
			time.Sleep(5 * time.Millisecond)

			short := idem.Message{Key: "p", Fingerprint: fp("p"), Retention: time.Millisecond}
			for _, m := range []idem.Message{short, {Key: "g1", Fingerprint: fp("g1")}} {
				if res, err := e.Process(ctx, m, nil); err != nil || res != idem.Processed {
					t.Fatalf("process %q = %v, %v", m.Key, res, err)
				}
			}
			// The batch's second pass takes g2 over.
			res, err := e.ProcessBatch(ctx, []idem.Message{{Key: "b", Fingerprint: fp("b")}, {Key: "g2", Fingerprint: fp("g2")}}, nil)
			if err != nil || len(res) != 2 || res[0] != idem.Processed || res[1] != idem.Processed {
				t.Fatalf("batch = %v, %v; want both processed", res, err)
			}
			for _, key := range []string{"p", "g1", "b", "g2"} {
				wantToken(key, 0, "a dedupe record")
			}
			for i, c := range held {
				key := fmt.Sprintf("g%d", i+1)
				err := e.s.Complete(ctx, idem.CompleteRequest{Key: key, Token: c.Token, Retention: time.Hour})
				if !errors.Is(err, idem.ErrLeaseLost) {
					t.Fatalf("the replaced holder's Complete of %q = %v; want ErrLeaseLost", key, err)
				}
			}
			wantToken("g1", 0, "after the replaced holder's Complete")

			// Once p's window passed, a Claim takes it over with a token
			// above the leases issued before.
			time.Sleep(5 * time.Millisecond)
			c, err := e.s.Claim(ctx, idem.ClaimRequest{Key: "p", Fingerprint: fp("p"), Lease: time.Minute})
			if err != nil || c.Outcome != idem.Acquired || c.Token <= held[1].Token {
				t.Fatalf("claim after the window = %+v, %v; want Acquired with a token above %d", c, err, held[1].Token)
			}
		})
	}
}
