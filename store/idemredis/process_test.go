package idemredis_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idemredis"
)

func pmsg(key, body string) idem.Message {
	return idem.Message{Scope: "pb", Key: key, Fingerprint: idem.FingerprintBytes([]byte(body)), Retention: time.Hour}
}

// TestProcessBatchOutcomes: fresh, done before, another payload and
// repeats within the batch, then the same batch again.
func TestProcessBatchOutcomes(t *testing.T) {
	t.Parallel()
	_, _, s := privateStore(t)
	ctx := context.Background()
	if _, err := s.ProcessBatch(ctx, []idem.Message{pmsg("done", "a"), pmsg("other", "a")}, func(context.Context, []int) error { return nil }); err != nil {
		t.Fatal(err)
	}
	msgs := []idem.Message{
		pmsg("new-1", "a"), // 0 processed
		pmsg("done", "a"),  // 1 duplicate
		pmsg("other", "b"), // 2 mismatched
		pmsg("new-1", "a"), // 3 repeat: duplicate
		pmsg("new-2", "a"), // 4 processed
		pmsg("new-2", "z"), // 5 repeat with another payload: mismatched
		pmsg("other", "b"), // 6 repeat of a mismatched one: mismatched
	}
	var got []int
	res, err := s.ProcessBatch(ctx, msgs, func(_ context.Context, fresh []int) error {
		got = fresh
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []idem.Outcome{idem.Processed, idem.Duplicate, idem.Mismatch, idem.Duplicate, idem.Processed, idem.Mismatch, idem.Mismatch}
	if !slices.Equal(res, want) {
		t.Fatalf("results %v, want %v", res, want)
	}
	if !slices.Equal(got, []int{0, 4}) {
		t.Fatalf("fresh %v, want [0 4]", got)
	}
	again, err := s.ProcessBatch(ctx, msgs[:2], func(context.Context, []int) error {
		t.Error("the handler ran for a batch with nothing fresh")
		return nil
	})
	if err != nil || !slices.Equal(again, []idem.Outcome{idem.Duplicate, idem.Duplicate}) {
		t.Fatalf("second run = %v, %v", again, err)
	}
	rec, err := s.Get(ctx, "pb", "new-1")
	if err != nil || rec.State != idem.StateCompleted || rec.ExpiresAt.Sub(rec.CompletedAt) != time.Hour {
		t.Fatalf("record = %+v, %v; want completed, kept for the message's retention", rec, err)
	}
}

// TestProcessBatchHandlerFailure: the leases are released, so the retry
// runs the same messages.
func TestProcessBatchHandlerFailure(t *testing.T) {
	t.Parallel()
	_, _, s := privateStore(t)
	ctx := context.Background()
	msgs := []idem.Message{pmsg("a", "1"), pmsg("b", "1")}
	boom := errors.New("smtp down")
	if _, err := s.ProcessBatch(ctx, msgs, func(context.Context, []int) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("failing handler = %v, want its error", err)
	}
	var ran []int
	res, err := s.ProcessBatch(ctx, msgs, func(_ context.Context, fresh []int) error { ran = fresh; return nil })
	if err != nil || !slices.Equal(ran, []int{0, 1}) || !slices.Equal(res, []idem.Outcome{idem.Processed, idem.Processed}) {
		t.Fatalf("retry = %v, %v, ran %v; want both processed", res, err, ran)
	}
}

// TestProcessBatchHandlerPanic: the panic goes on, the heartbeat stops and
// the leases are given back.
func TestProcessBatchHandlerPanic(t *testing.T) {
	t.Parallel()
	addr := startRedis(t)
	c := clientAt(t, addr)
	s := newStore(t, c, &idemredis.Config{ProcessLease: 300 * time.Millisecond})
	ctx := context.Background()
	msgs := []idem.Message{pmsg("a", "1"), pmsg("b", "1")}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the handler's panic did not go on")
			}
		}()
		_, _ = s.ProcessBatch(ctx, msgs, func(context.Context, []int) error { panic("handler bug") })
	}()
	for _, m := range msgs {
		cl, err := s.Claim(ctx, idem.ClaimRequest{Scope: "pb", Key: m.Key, Fingerprint: m.Fingerprint, Lease: time.Minute})
		if err != nil || cl.Outcome != idem.Acquired {
			t.Errorf("%s after the panic: %v, %v; want acquired (released)", m.Key, cl.Outcome, err)
		}
	}
}

// TestProcessBatchCompletionRefused: when a record is gone by the time
// the batch completes (an operator deleted it), the batch reports that its
// effects ran but were not all recorded.
func TestProcessBatchCompletionRefused(t *testing.T) {
	t.Parallel()
	_, _, s := privateStore(t)
	ctx := context.Background()
	_, err := s.ProcessBatch(ctx, []idem.Message{pmsg("kept", "1"), pmsg("gone", "1")}, func(ctx context.Context, _ []int) error {
		return s.Delete(ctx, "pb", "gone")
	})
	if !errors.Is(err, idem.ErrLeaseLost) || !strings.Contains(err.Error(), "could not all be recorded") {
		t.Fatalf("batch whose record was deleted = %v, want ErrLeaseLost, not all recorded", err)
	}
	if rec, err := s.Get(ctx, "pb", "kept"); err != nil || rec.State != idem.StateCompleted {
		t.Fatalf("the other record = %+v, %v; want completed", rec, err)
	}
}

// TestProcessBatchInProgress: a key another caller holds fails the batch
// before the handler, and the batch's own leases are given back.
func TestProcessBatchInProgress(t *testing.T) {
	t.Parallel()
	_, _, s := privateStore(t)
	ctx := context.Background()
	other, err := s.Claim(ctx, idem.ClaimRequest{Scope: "pb", Key: "held", Fingerprint: pmsg("held", "1").Fingerprint, Lease: time.Minute})
	if err != nil || other.Outcome != idem.Acquired {
		t.Fatal(other, err)
	}
	_, err = s.ProcessBatch(ctx, []idem.Message{pmsg("a", "1"), pmsg("held", "1"), pmsg("b", "1")}, func(context.Context, []int) error {
		t.Error("the handler ran although a key was held")
		return nil
	})
	if !errors.Is(err, idem.ErrInProgress) || !idem.IsRetryable(err) {
		t.Fatalf("batch with a held key = %v, want a retryable ErrInProgress", err)
	}
	for _, k := range []string{"a", "b"} {
		c, err := s.Claim(ctx, idem.ClaimRequest{Scope: "pb", Key: k, Fingerprint: pmsg(k, "1").Fingerprint, Lease: time.Minute})
		if err != nil || c.Outcome != idem.Acquired {
			t.Errorf("%s after the failed batch: %v, %v; want acquired (released)", k, c.Outcome, err)
		}
	}
}

// TestProcessBatchHeartbeat: a handler longer than two leases keeps them,
// and a lease deleted under it cancels it with ErrLeaseLost.
func TestProcessBatchHeartbeat(t *testing.T) {
	t.Parallel()
	addr := startRedis(t)
	c := clientAt(t, addr)
	// The lease leaves a busy CI machine room: three heartbeats (every
	// 200ms) would have to fail in a row to lose it.
	s := newStore(t, c, &idemredis.Config{ProcessLease: 600 * time.Millisecond})
	ctx := context.Background()
	res, err := s.ProcessBatch(ctx, []idem.Message{pmsg("long", "1")}, func(ctx context.Context, _ []int) error {
		deadline := time.Now().Add(1500 * time.Millisecond) // two and a half leases
		for time.Now().Before(deadline) {
			cl, err := s.Claim(ctx, idem.ClaimRequest{Scope: "pb", Key: "long", Fingerprint: pmsg("long", "1").Fingerprint, Lease: time.Minute})
			if err != nil {
				return err
			}
			if cl.Outcome != idem.InProgress {
				return fmt.Errorf("a rival's claim during the handler: %v, want in_progress (the heartbeat keeps the lease)", cl.Outcome)
			}
			time.Sleep(50 * time.Millisecond)
		}
		return nil
	})
	if err != nil || res[0] != idem.Processed {
		t.Fatalf("long handler = %v, %v", res, err)
	}

	_, err = s.ProcessBatch(ctx, []idem.Message{pmsg("lost", "1")}, func(ctx context.Context, _ []int) error {
		if err := s.Delete(ctx, "pb", "lost"); err != nil { // an operator deletes the record
			return err
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(5 * time.Second):
			return errors.New("the handler was not cancelled")
		}
	})
	if !errors.Is(err, idem.ErrLeaseLost) || !idem.IsRetryable(err) {
		t.Fatalf("batch whose lease was lost = %v, want a retryable ErrLeaseLost", err)
	}
	if _, err := s.Get(ctx, "pb", "lost"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("a lost batch must not complete the record: Get = %v", err)
	}
}

// TestProcessBatchConcurrent: 16 goroutines feed the same 200 messages in
// shuffled batches of 10, retrying batches that meet a key in progress;
// every message's effect runs exactly once.
func TestProcessBatchConcurrent(t *testing.T) {
	t.Parallel()
	_, _, s := privateStore(t)
	ctx := context.Background()
	const n, workers, size = 200, 16, 10
	var mu sync.Mutex
	effects := make(map[string]int)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 1))
			order := r.Perm(n)
			for lo := 0; lo < n; lo += size {
				batch := make([]idem.Message, 0, size)
				for _, i := range order[lo : lo+size] {
					batch = append(batch, pmsg(fmt.Sprint("m", i), "x"))
				}
				for attempt := 0; ; attempt++ {
					_, err := s.ProcessBatch(ctx, batch, func(_ context.Context, fresh []int) error {
						mu.Lock()
						defer mu.Unlock()
						for _, i := range fresh {
							effects[batch[i].Key]++
						}
						return nil
					})
					if err == nil {
						break
					}
					if !errors.Is(err, idem.ErrInProgress) || attempt == 200 {
						t.Errorf("worker %d: %v", w, err)
						return
					}
					time.Sleep(time.Duration(1+r.IntN(5)) * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	if len(effects) != n {
		t.Fatalf("%d messages had effects, want %d", len(effects), n)
	}
	for k, v := range effects {
		if v != 1 {
			t.Fatalf("%s ran %d times", k, v)
		}
	}
}

func TestProcessBatchRefusesBadInput(t *testing.T) {
	t.Parallel()
	_, c, s := privateStore(t)
	ctx := context.Background()
	ok := func(context.Context, []int) error { return nil }
	if _, err := s.ProcessBatch(ctx, []idem.Message{pmsg("a", "1"), {Scope: "pb", Key: ""}}, ok); !errors.Is(err, idem.ErrInvalidKey) {
		t.Fatalf("empty key = %v", err)
	}
	if _, err := s.ProcessBatch(ctx, []idem.Message{pmsg("a", "1")}, nil); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("nil handler = %v", err)
	}
	huge := make([]idem.Message, idemredis.MaxBatch+1)
	for i := range huge {
		huge[i] = pmsg(fmt.Sprint(i), "1")
	}
	if _, err := s.ProcessBatch(ctx, huge, ok); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("oversized batch = %v", err)
	}
	if n, err := c.Do(ctx, c.B().Dbsize().Build()).AsInt64(); err != nil || n != 0 {
		t.Fatalf("refused batches wrote %d keys (%v)", n, err)
	}
	if res, err := s.ProcessBatch(ctx, nil, ok); res != nil || err != nil {
		t.Fatalf("empty batch = %v, %v", res, err)
	}
}
