package idemsqlite

import (
	"context"
	"sync"
)

// writeQueue is a lock handed over in arrival order, with two classes of
// waiters: lease holders (heartbeats, completions, releases) go before
// everyone else. A holder's heartbeat must land within its lease; a claim
// or a message that waits a little longer only waits.
type writeQueue struct {
	mu      sync.Mutex
	held    bool
	holders []chan struct{}
	others  []chan struct{}
}

// lock waits for the lock until ctx ends; it returns context.Cause(ctx)
// when it gave up.
func (q *writeQueue) lock(ctx context.Context, holder bool) error {
	q.mu.Lock()
	if !q.held {
		q.held = true
		q.mu.Unlock()
		return nil
	}
	turn := make(chan struct{})
	if holder {
		q.holders = append(q.holders, turn)
	} else {
		q.others = append(q.others, turn)
	}
	q.mu.Unlock()

	select {
	case <-turn:
		return nil
	case <-ctx.Done():
	}
	q.mu.Lock()
	removed := remove(&q.holders, turn) || remove(&q.others, turn)
	q.mu.Unlock()
	if !removed {
		// The lock was handed over while ctx ended: pass it on.
		q.unlock()
	}
	return context.Cause(ctx)
}

// idle reports that nobody holds the lock (and so nobody waits for it).
// It is a hint: the answer may be stale by the time the caller acts on it.
func (q *writeQueue) idle() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return !q.held
}

// unlock hands the lock to the first waiting holder, else to the first
// other waiter, else frees it.
func (q *writeQueue) unlock() {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, waiters := range []*[]chan struct{}{&q.holders, &q.others} {
		if len(*waiters) > 0 {
			next := (*waiters)[0]
			(*waiters)[0] = nil
			*waiters = (*waiters)[1:]
			close(next)
			return
		}
	}
	q.held = false
}

func remove(waiters *[]chan struct{}, turn chan struct{}) bool {
	for i, w := range *waiters {
		if w == turn {
			*waiters = append((*waiters)[:i], (*waiters)[i+1:]...)
			return true
		}
	}
	return false
}
