package idemsqlite

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// TestWriteQueueHoldersFirst queues others, then holders, behind a held
// lock and checks the order in which they get it: holders first, each class
// in arrival order.
func TestWriteQueueHoldersFirst(t *testing.T) {
	t.Parallel()
	var q writeQueue
	ctx := context.Background()
	if err := q.lock(ctx, false); err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		order []string
		wg    sync.WaitGroup
	)
	for i, w := range []struct {
		name   string
		holder bool
	}{{"claim-1", false}, {"claim-2", false}, {"extend-1", true}, {"claim-3", false}, {"extend-2", true}} {
		wg.Go(func() {
			if err := q.lock(ctx, w.holder); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, w.name)
			mu.Unlock()
			q.unlock()
		})
		waitQueued(t, &q, i+1)
	}
	q.unlock()
	wg.Wait()
	want := []string{"extend-1", "extend-2", "claim-1", "claim-2", "claim-3"}
	if len(order) != len(want) {
		t.Fatalf("order = %v, want %v", order, want)
	}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("order = %v, want %v", order, want)
		}
	}
	if q.held {
		t.Errorf("lock still held after everyone unlocked")
	}
}

func waitQueued(t *testing.T, q *writeQueue, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		q.mu.Lock()
		got := len(q.holders) + len(q.others)
		q.mu.Unlock()
		if got == n {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("%d waiters never queued", n)
}

// TestWriteQueueCancel gives up waiting when the context ends, leaves the
// queue clean and lets the next waiter through.
func TestWriteQueueCancel(t *testing.T) {
	t.Parallel()
	var q writeQueue
	if err := q.lock(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	cause := errors.New("request gone")
	ctx, cancel := context.WithCancelCause(context.Background())
	done := make(chan error)
	go func() { done <- q.lock(ctx, true) }()
	waitQueued(t, &q, 1)
	cancel(cause)
	if err := <-done; !errors.Is(err, cause) {
		t.Fatalf("cancelled lock: got %v, want the context's cause", err)
	}
	waitQueued(t, &q, 0)
	q.unlock()
	if q.held {
		t.Fatalf("lock held after its only owner unlocked")
	}
	if err := q.lock(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	q.unlock()
}

// TestWriteQueueCancelAfterHandover covers a waiter whose context ends just
// as the lock is handed to it: it must pass the lock on, not leak it.
func TestWriteQueueCancelAfterHandover(t *testing.T) {
	t.Parallel()
	for range 200 {
		var q writeQueue
		_ = q.lock(context.Background(), false)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- q.lock(ctx, false) }()
		waitQueued(t, &q, 1)
		go cancel()
		q.unlock()
		if err := <-done; err == nil {
			q.unlock()
		}
		lockCtx, stop := context.WithTimeout(context.Background(), 5*time.Second)
		if err := q.lock(lockCtx, true); err != nil {
			t.Fatalf("lock leaked by a cancelled waiter: %v", err)
		}
		stop()
		q.unlock()
	}
}
