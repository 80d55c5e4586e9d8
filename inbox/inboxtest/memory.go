package inboxtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/inbox/inboxdriver"
)

// Memory is an inbox backend in memory, just enough for [inbox.Worker]'s
// RunOnce: for tests of what the worker itself does (hooks, failures,
// heartbeats) that need no database. Receive and the Admin methods are not
// implemented (they panic).
//
//   - Claim hands out Rows, in order, up to the claim's limit.
//   - Complete runs the handler, unless the row is in Lost (an error
//     wrapping idem.ErrLeaseLost) or in Panics (it panics, as a broken
//     backend would).
//   - Fail records the request (see [Memory.Fails]).
//   - Extend fails the first ExtendErrs heartbeats with an idem.Retryable
//     error, then keeps every lease but those of the rows in Dropped.
//   - Release fails with ReleaseErr if set.
//
// Set the fields before the worker runs.
type Memory struct {
	inboxdriver.Backend[struct{}]
	Rows                  []inbox.Row
	Lost, Panics, Dropped map[int64]bool
	ExtendErrs            int
	ReleaseErr            error

	mu      sync.Mutex
	fails   []inboxdriver.FailRequest
	extends int
}

// Claim implements [inboxdriver.Backend].
func (m *Memory) Claim(_ context.Context, req inboxdriver.ClaimRequest) ([]inbox.Row, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := min(req.Limit, len(m.Rows))
	out := m.Rows[:n]
	m.Rows = m.Rows[n:]
	return out, nil
}

// Complete implements [inboxdriver.Backend].
func (m *Memory) Complete(ctx context.Context, l inboxdriver.Lease, fn func(context.Context, struct{}) error) error {
	if m.Panics[l.ID] {
		panic("inboxtest: memory backend panics on purpose")
	}
	if m.Lost[l.ID] {
		return fmt.Errorf("inboxtest: memory row %d: %w", l.ID, idem.ErrLeaseLost)
	}
	return fn(ctx, struct{}{})
}

// Fail implements [inboxdriver.Backend].
func (m *Memory) Fail(_ context.Context, req inboxdriver.FailRequest) error {
	m.mu.Lock()
	m.fails = append(m.fails, req)
	m.mu.Unlock()
	return nil
}

// Extend implements [inboxdriver.Backend].
func (m *Memory) Extend(_ context.Context, ls []inboxdriver.Lease, _ time.Duration) ([]int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.extends++
	if m.extends <= m.ExtendErrs {
		return nil, idem.Retryable(errors.New("inboxtest: memory database busy"))
	}
	var ids []int64
	for _, l := range ls {
		if !m.Dropped[l.ID] {
			ids = append(ids, l.ID)
		}
	}
	return ids, nil
}

// Release implements [inboxdriver.Backend].
func (m *Memory) Release(_ context.Context, ls []inboxdriver.Lease) (int64, error) {
	if m.ReleaseErr != nil {
		return 0, m.ReleaseErr
	}
	return int64(len(ls)), nil
}

// Fails returns the failures recorded so far, in order.
func (m *Memory) Fails() []inboxdriver.FailRequest {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]inboxdriver.FailRequest(nil), m.fails...)
}

// Extends returns how many heartbeats were sent, failed ones included.
func (m *Memory) Extends() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.extends
}
