package idemredis_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idemredis"
)

func batchReq(key, body string, lease time.Duration) idem.ClaimRequest {
	return idem.ClaimRequest{Scope: "batch", Key: key, Fingerprint: idem.FingerprintBytes([]byte(body)), Lease: lease}
}

// TestClaimBatchOutcomes: one batch meets every state a key can be in, in
// order, with two leases, a key twice and a key of another type; each item
// gets its own outcome or error and the calls are as few as Coalesce
// allows.
func TestClaimBatchOutcomes(t *testing.T) {
	t.Parallel()
	_, c, s := privateStore(t)
	ctx := context.Background()

	done, err := s.Claim(ctx, batchReq("done", "a", time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, idem.CompleteRequest{Scope: "batch", Key: "done", Token: done.Token, Result: []byte("receipt"), Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	held, err := s.Claim(ctx, batchReq("held", "a", time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	do(t, c, c.B().Hset().Key(s.RecordKey("batch", "hash")).FieldValue().FieldValue("f", "v").Build())
	do(t, c, c.B().ConfigResetstat().Build())

	reqs := []idem.ClaimRequest{
		batchReq("new-1", "a", time.Minute),
		batchReq("done", "a", time.Minute),
		batchReq("done", "b", time.Minute),
		batchReq("held", "a", time.Minute),
		batchReq("hash", "a", time.Minute),
		batchReq("twice", "a", time.Minute),
		batchReq("twice", "a", time.Minute),
		batchReq("short", "a", 2*time.Second), // another lease: another call
		batchReq("new-2", "a", time.Minute),
	}
	before := time.Now()
	got, err := s.ClaimBatch(ctx, reqs)
	if err != nil {
		t.Fatalf("ClaimBatch = %v", err)
	}
	if len(got) != len(reqs) {
		t.Fatalf("%d items for %d requests", len(got), len(reqs))
	}
	want := []idem.Outcome{idem.Acquired, idem.Completed, idem.Mismatch, idem.InProgress, "", idem.Acquired, idem.InProgress, idem.Acquired, idem.Acquired}
	for i, w := range want {
		if w == "" {
			if !errors.Is(got[i].Err, idemredis.ErrRecordFormat) {
				t.Errorf("item %d (%s): error %v, want ErrRecordFormat", i, reqs[i].Key, got[i].Err)
			}
			continue
		}
		if got[i].Err != nil || got[i].Outcome != w {
			t.Errorf("item %d (%s): %v, %v; want %v", i, reqs[i].Key, got[i].Outcome, got[i].Err, w)
		}
	}
	if r := got[1].Record; r == nil || string(r.Result) != "receipt" {
		t.Errorf("completed item's record = %+v, want the stored result", r)
	}
	if got[3].Record == nil || got[3].Record.Token != held.Token {
		t.Errorf("held item's record = %+v, want the holder's token %d", got[3].Record, held.Token)
	}
	// The leases are each request's own, by the server's clock.
	if d := got[7].LeaseExpiresAt.Sub(before); d < time.Second || d > 3*time.Second {
		t.Errorf("2s lease expires in %v", d)
	}
	if d := got[8].LeaseExpiresAt.Sub(before); d < 50*time.Second || d > 70*time.Second {
		t.Errorf("1m lease expires in %v", d)
	}
	// Runs of one lease share a call: [new-1 … twice], [short], [new-2].
	if n := scriptCalls(t, c); n != 3 {
		t.Errorf("%d script calls, want 3", n)
	}
	// The leases are real: the acquired keys are held now.
	again, err := s.ClaimBatch(ctx, []idem.ClaimRequest{reqs[0], reqs[5], reqs[8]})
	if err != nil {
		t.Fatal(err)
	}
	for i, it := range again {
		if it.Err != nil || it.Outcome != idem.InProgress {
			t.Errorf("second batch item %d: %v, %v; want in_progress", i, it.Outcome, it.Err)
		}
	}
	// And the holders complete them as usual.
	if err := s.Complete(ctx, idem.CompleteRequest{Scope: "batch", Key: "new-1", Token: got[0].Token, Result: []byte("r"), Retention: time.Hour}); err != nil {
		t.Fatalf("complete an item of the batch: %v", err)
	}
}

// TestClaimBatchSplitsByCoalesce: 200 keys with Coalesce 64 take 4 calls,
// and a racing batch of the same keys from another goroutine wins each key
// once between them.
func TestClaimBatchSplitsByCoalesce(t *testing.T) {
	t.Parallel()
	_, c, s := privateStore(t)
	ctx := context.Background()
	reqs := make([]idem.ClaimRequest, 200)
	for i := range reqs {
		reqs[i] = batchReq(fmt.Sprint("k", i), "a", time.Minute)
	}
	do(t, c, c.B().ConfigResetstat().Build())
	const racers = 8
	results := make([][]idemredis.BatchClaim, racers)
	var wg sync.WaitGroup
	for r := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if results[r], err = s.ClaimBatch(ctx, reqs); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	for i := range reqs {
		acquired := 0
		for r := range racers {
			it := results[r][i]
			switch {
			case it.Err != nil:
				t.Fatalf("racer %d item %d: %v", r, i, it.Err)
			case it.Outcome == idem.Acquired:
				acquired++
			case it.Outcome != idem.InProgress:
				t.Fatalf("racer %d item %d: %v", r, i, it.Outcome)
			}
		}
		if acquired != 1 {
			t.Fatalf("key %d acquired %d times by %d racing batches, want once", i, acquired, racers)
		}
	}
	if n := scriptCalls(t, c); n != racers*4 {
		t.Errorf("%d script calls for %d batches of 200, want %d (Coalesce 64)", n, racers, racers*4)
	}
}

// TestClaimBatchRefusesBadInput: an invalid request or an oversized batch
// is refused before anything is written.
func TestClaimBatchRefusesBadInput(t *testing.T) {
	t.Parallel()
	_, c, s := privateStore(t)
	ctx := context.Background()
	bad := []idem.ClaimRequest{batchReq("ok-1", "a", time.Minute), batchReq("bad\nkey", "a", time.Minute), batchReq("ok-2", "a", time.Minute)}
	if _, err := s.ClaimBatch(ctx, bad); !errors.Is(err, idem.ErrInvalidKey) || !strings.Contains(err.Error(), "request 1") {
		t.Fatalf("batch with an invalid key = %v, want ErrInvalidKey naming request 1", err)
	}
	noLease := []idem.ClaimRequest{batchReq("ok-1", "a", 0)}
	if _, err := s.ClaimBatch(ctx, noLease); err == nil {
		t.Fatal("a batch with a zero lease was accepted")
	}
	huge := make([]idem.ClaimRequest, idemredis.MaxBatch+1)
	for i := range huge {
		huge[i] = batchReq(fmt.Sprint("h", i), "a", time.Minute)
	}
	if _, err := s.ClaimBatch(ctx, huge); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("oversized batch = %v, want ErrInvalidConfig", err)
	}
	if n, err := c.Do(ctx, c.B().Dbsize().Build()).AsInt64(); err != nil || n != 0 {
		t.Fatalf("refused batches wrote %d keys (%v)", n, err)
	}
	if got, err := s.ClaimBatch(ctx, nil); err != nil || got != nil {
		t.Fatalf("empty batch = %v, %v", got, err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.ClaimBatch(cctx, bad[:1]); !errors.Is(err, context.Canceled) {
		t.Fatalf("batch with a cancelled context = %v", err)
	}
}

// TestBatchesServerGone: batches against a dead server fail as a whole,
// with a retryable error on the batch and on every item; ProcessBatch runs
// nothing.
func TestBatchesServerGone(t *testing.T) {
	t.Parallel()
	addr := startRedis(t)
	c := clientAt(t, addr)
	// Not newStore: its cleanup deletes the test's keys, from a server that
	// will be gone.
	s, err := idemredis.New(c, &idemredis.Config{Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	// SHUTDOWN NOSAVE ends the server; the reply never comes.
	_ = c.Do(ctx, c.B().Shutdown().Nosave().Build()).Error()
	if err := waitPing(addr, 100*time.Millisecond); err == nil {
		t.Fatal("the server still answers after SHUTDOWN")
	}
	got, err := s.ClaimBatch(ctx, []idem.ClaimRequest{batchReq("a", "a", time.Minute), batchReq("b", "a", time.Minute)})
	if err == nil || !idem.IsRetryable(err) {
		t.Fatalf("batch against a dead server = %v, want a retryable error", err)
	}
	for i, it := range got {
		if !idem.IsRetryable(it.Err) {
			t.Errorf("claim item %d: %v, want the retryable error", i, it.Err)
		}
	}
	errs, err := s.CompleteBatch(ctx, []idem.CompleteRequest{
		{Scope: "batch", Key: "a", Token: 7, Retention: time.Hour}, {Scope: "batch", Key: "b", Token: 8, Retention: time.Hour},
	})
	if err == nil || !idem.IsRetryable(err) {
		t.Fatalf("complete batch against a dead server = %v, want a retryable error", err)
	}
	for i, err := range errs {
		if !idem.IsRetryable(err) {
			t.Errorf("complete item %d: %v, want the retryable error", i, err)
		}
	}
	_, err = s.ProcessBatch(ctx, []idem.Message{{Scope: "batch", Key: "a"}}, func(context.Context, []int) error {
		t.Error("the handler ran although nothing could be claimed")
		return nil
	})
	if err == nil || !idem.IsRetryable(err) {
		t.Fatalf("process batch against a dead server = %v, want a retryable error", err)
	}
}

// TestClaimBatchUnbatched: with Coalesce 1 every key is its own call, all
// in one round trip, with the same outcomes.
func TestClaimBatchUnbatched(t *testing.T) {
	t.Parallel()
	addr := startRedis(t)
	c := clientAt(t, addr)
	s := newStore(t, c, &idemredis.Config{Coalesce: 1})
	do(t, c, c.B().ConfigResetstat().Build())
	got, err := s.ClaimBatch(context.Background(), []idem.ClaimRequest{
		batchReq("x", "a", time.Minute), batchReq("x", "a", time.Minute), batchReq("y", "a", time.Minute),
	})
	if err != nil {
		t.Fatal(err)
	}
	if got[0].Outcome != idem.Acquired || got[1].Outcome != idem.InProgress || got[2].Outcome != idem.Acquired {
		t.Fatalf("outcomes %v %v %v", got[0].Outcome, got[1].Outcome, got[2].Outcome)
	}
	if n := scriptCalls(t, c); n != 3 {
		t.Errorf("%d script calls, want 3", n)
	}
}

// TestCompleteBatch: each record of a batch is completed against its own
// token, with its own error, in one round trip.
func TestCompleteBatch(t *testing.T) {
	t.Parallel()
	_, c, s := privateStore(t)
	ctx := context.Background()
	keys := []string{"ok-1", "ok-2", "stale", "zero", "big"}
	reqs := make([]idem.ClaimRequest, len(keys))
	for i, k := range keys {
		reqs[i] = batchReq(k, "a", time.Minute)
	}
	claims, err := s.ClaimBatch(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	do(t, c, c.B().Hset().Key(s.RecordKey("batch", "hash")).FieldValue().FieldValue("f", "v").Build())
	complete := func(i int, token int64, result string) idem.CompleteRequest {
		return idem.CompleteRequest{Scope: "batch", Key: keys[i], Token: token, Result: []byte(result), Retention: time.Hour}
	}
	big := strings.Repeat("x", idem.DefaultMaxResultBytes+1)
	do(t, c, c.B().ConfigResetstat().Build())
	errs, err := s.CompleteBatch(ctx, []idem.CompleteRequest{
		complete(0, claims[0].Token, "r0"),
		complete(1, claims[1].Token, "r1"),
		complete(2, claims[2].Token-1, "stale"),
		complete(3, 0, "never sent"),
		complete(4, claims[4].Token, big),
		{Scope: "batch", Key: "hash", Token: 7, Result: []byte("r"), Retention: time.Hour},
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []error{nil, nil, idem.ErrLeaseLost, idem.ErrLeaseLost, nil, idemredis.ErrRecordFormat} {
		if (want == nil) != (errs[i] == nil) || (want != nil && !errors.Is(errs[i], want)) {
			t.Errorf("item %d: %v, want %v", i, errs[i], want)
		}
	}
	if n := scriptCalls(t, c); n != 1 {
		t.Errorf("%d script calls, want 1", n)
	}
	again, err := s.ClaimBatch(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"r0", "r1", "", "", ""} {
		it := again[i]
		switch {
		case i < 2 && (it.Outcome != idem.Completed || string(it.Record.Result) != want):
			t.Errorf("%s after CompleteBatch: %v %+v, want completed with %q", keys[i], it.Outcome, it.Record, want)
		case i == 2 || i == 3:
			if it.Outcome != idem.InProgress {
				t.Errorf("%s after a refused complete: %v, want still in progress", keys[i], it.Outcome)
			}
		case i == 4 && (it.Outcome != idem.Completed || !it.Record.Tombstone):
			t.Errorf("%s with an oversized result: %v %+v, want a completed tombstone", keys[i], it.Outcome, it.Record)
		}
	}
	noRetention := complete(1, claims[1].Token, "r")
	noRetention.Retention = 0
	if _, err := s.CompleteBatch(ctx, []idem.CompleteRequest{complete(0, 1, "r"), noRetention}); !errors.Is(err, idem.ErrInvalidConfig) || !strings.Contains(err.Error(), "request 1") {
		t.Fatalf("batch with a zero retention = %v, want ErrInvalidConfig naming request 1", err)
	}
	if errs, err := s.CompleteBatch(ctx, nil); errs != nil || err != nil {
		t.Fatalf("empty batch = %v, %v", errs, err)
	}
}
