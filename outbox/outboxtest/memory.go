package outboxtest

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/outbox/outboxdriver"
)

// Memory is an outbox in memory: an [outboxdriver.Backend] over
// *MemoryTx that passes [Run], for tests and examples of code that writes
// events or runs a relay without a database. It is not durable: use a SQL
// store's outbox in production.
type Memory struct {
	mu     sync.Mutex
	rows   map[int64]*outbox.Row
	byID   map[string]int64
	nextID int64
	token  int64
}

var _ outboxdriver.Backend[*MemoryTx] = (*Memory)(nil)

// NewMemory returns an empty in-memory outbox.
func NewMemory() *Memory { return &Memory{rows: map[int64]*outbox.Row{}, byID: map[string]int64{}} }

// MemoryTx is a transaction of a [Memory] outbox: its writes become
// visible at Commit, and never after Rollback.
type MemoryTx struct {
	m    *Memory
	evs  []outbox.Event
	done bool
}

// Begin starts a transaction.
func (m *Memory) Begin() *MemoryTx { return &MemoryTx{m: m} }

// InTx is Env.InTx for m.
func (m *Memory) InTx(ctx context.Context, fn func(ctx context.Context, tx *MemoryTx) error) error {
	tx := m.Begin()
	if err := fn(ctx, tx); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

// Commit makes the transaction's events visible.
func (tx *MemoryTx) Commit() error {
	if tx.done {
		return fmt.Errorf("outboxtest: transaction already ended")
	}
	tx.done = true
	m := tx.m
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	for _, ev := range tx.evs {
		if _, ok := m.byID[ev.ID]; ok {
			continue
		}
		m.nextID++
		m.rows[m.nextID] = &outbox.Row{ID: m.nextID, EventID: ev.ID, Topic: ev.Topic, Key: ev.Key, Payload: ev.Payload,
			Headers: maps.Clone(ev.Headers), State: outbox.StatePending, CreatedAt: now, NextAttemptAt: now}
		m.byID[ev.ID] = m.nextID
	}
	return nil
}

// Rollback drops the transaction's events.
func (tx *MemoryTx) Rollback() { tx.done = true }

// Write implements [outboxdriver.Writer].
func (m *Memory) Write(_ context.Context, tx *MemoryTx, evs ...outbox.Event) error {
	if tx == nil {
		return fmt.Errorf("%w: outboxtest: nil transaction", idem.ErrInvalidConfig)
	}
	evs, err := outboxdriver.PrepareAll(evs)
	if err != nil {
		return err
	}
	if tx.done {
		return fmt.Errorf("outboxtest: transaction already ended")
	}
	tx.evs = append(tx.evs, evs...)
	return nil
}

// copyRow returns a copy of r with its derived fields set.
func copyRow(r *outbox.Row) outbox.Row {
	c := *r
	c.Payload = slices.Clone(r.Payload)
	c.Headers = maps.Clone(r.Headers)
	c.LeaseExpiresAt = time.Time{}
	c.Finish()
	return c
}

// sorted returns the rows in id order.
func (m *Memory) sorted() []*outbox.Row {
	out := slices.Collect(maps.Values(m.rows))
	slices.SortFunc(out, func(a, b *outbox.Row) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// Claim implements [outboxdriver.Driver].
func (m *Memory) Claim(_ context.Context, req outboxdriver.ClaimRequest) ([]outbox.Row, error) {
	if err := outboxdriver.ValidateClaim(req); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	held := map[string]bool{} // keys with an earlier event not sent
	var due []*outbox.Row
	for _, r := range m.sorted() {
		blocked := req.Ordered && r.Key != "" && held[r.Key]
		if r.State != outbox.StateSent && r.Key != "" {
			held[r.Key] = true
		}
		if (r.State == outbox.StatePending || r.State == outbox.StateSending) && !r.NextAttemptAt.After(now) && !blocked {
			due = append(due, r)
		}
	}
	slices.SortStableFunc(due, func(a, b *outbox.Row) int { return a.NextAttemptAt.Compare(b.NextAttemptAt) })
	out := []outbox.Row{}
	for _, r := range due[:min(len(due), req.Limit)] {
		m.token++
		r.State, r.Token, r.NextAttemptAt, r.LastAttemptAt = outbox.StateSending, m.token, now.Add(req.Lease), now
		out = append(out, copyRow(r))
	}
	return out, nil
}

// held returns the row of l if its lease is current.
func (m *Memory) held(l outboxdriver.Lease) *outbox.Row {
	r := m.rows[l.ID]
	if r == nil || r.State != outbox.StateSending || r.Token != l.Token {
		return nil
	}
	return r
}

// MarkSent implements [outboxdriver.Driver].
func (m *Memory) MarkSent(_ context.Context, ls []outboxdriver.Lease) ([]int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []int64
	now := time.Now()
	for _, l := range ls {
		if r := m.held(l); r != nil {
			r.State, r.FinishedAt, r.NextAttemptAt = outbox.StateSent, now, now
			out = append(out, l.ID)
		}
	}
	return out, nil
}

// Fail implements [outboxdriver.Driver].
func (m *Memory) Fail(_ context.Context, reqs []outboxdriver.FailRequest) ([]int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []int64
	now := time.Now()
	for _, f := range reqs {
		r := m.held(f.Lease)
		if r == nil {
			continue
		}
		if !f.Uncounted {
			r.Attempts++
		}
		r.State, r.LastError, r.NextAttemptAt = outbox.StatePending, outboxdriver.CutError(f.Error), now.Add(max(f.Delay, 0))
		if f.Dead {
			r.State, r.DeadReason, r.FinishedAt = outbox.StateDead, f.DeadReason, now
		}
		out = append(out, f.ID)
	}
	return out, nil
}

// Release implements [outboxdriver.Driver].
func (m *Memory) Release(_ context.Context, ls []outboxdriver.Lease) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var n int64
	for _, l := range ls {
		if r := m.held(l); r != nil {
			r.State, r.NextAttemptAt = outbox.StatePending, time.Now()
			n++
		}
	}
	return n, nil
}

// PurgeSent implements [outboxdriver.Admin].
func (m *Memory) PurgeSent(_ context.Context, olderThan time.Duration, limit int) (int64, error) {
	if _, err := outboxdriver.ValidatePurge(olderThan, limit, outboxdriver.MaxBatch); err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var n int64
	cut := time.Now().Add(-olderThan)
	for id, r := range m.rows {
		if r.State == outbox.StateSent && !r.FinishedAt.After(cut) {
			delete(m.rows, id)
			delete(m.byID, r.EventID)
			n++
		}
	}
	return n, nil
}

// Stats implements [outboxdriver.Admin].
func (m *Memory) Stats(context.Context) ([]outbox.StateCount, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	by := map[outbox.State]outbox.StateCount{}
	now := time.Now()
	for _, r := range m.rows {
		c := by[r.State]
		c.Count++
		c.Oldest = max(c.Oldest, now.Sub(r.CreatedAt))
		by[r.State] = c
	}
	return outboxdriver.StatsInOrder(by), nil
}

// List implements [outboxdriver.Admin].
func (m *Memory) List(_ context.Context, req outbox.ListRequest) ([]outbox.Row, error) {
	limit, err := outboxdriver.ListLimit(req)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []outbox.Row
	for _, r := range m.sorted() {
		if r.State == req.State && r.ID > req.AfterID && len(out) < limit {
			out = append(out, copyRow(r))
		}
	}
	return out, nil
}

// Get implements [outboxdriver.Admin].
func (m *Memory) Get(_ context.Context, id int64) (outbox.Row, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r := m.rows[id]; r != nil {
		return copyRow(r), nil
	}
	return outbox.Row{}, outboxdriver.NotFound("outboxtest", id)
}

// GetByEventID implements [outboxdriver.Admin].
func (m *Memory) GetByEventID(ctx context.Context, eventID string) (outbox.Row, error) {
	m.mu.Lock()
	id, ok := m.byID[eventID]
	m.mu.Unlock()
	if !ok {
		return outbox.Row{}, outboxdriver.NotFound("outboxtest", fmt.Sprintf("%q", eventID))
	}
	return m.Get(ctx, id)
}

// dead applies fn to the selected dead rows and returns how many.
func (m *Memory) dead(sel outbox.Select, fn func(r *outbox.Row)) (int64, error) {
	if err := outboxdriver.ValidateSelect(sel); err != nil {
		return 0, err
	}
	want := map[int64]bool{}
	for _, id := range sel.IDs {
		want[id] = true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var n int64
	for _, r := range m.sorted() {
		if r.State == outbox.StateDead && (sel.All || want[r.ID]) {
			fn(r)
			n++
		}
	}
	return n, nil
}

// Redrive implements [outboxdriver.Admin].
func (m *Memory) Redrive(_ context.Context, sel outbox.Select) (int64, error) {
	return m.dead(sel, func(r *outbox.Row) {
		r.State, r.Attempts, r.DeadReason, r.FinishedAt, r.NextAttemptAt = outbox.StatePending, 0, "", time.Time{}, time.Now()
	})
}

// Discard implements [outboxdriver.Admin].
func (m *Memory) Discard(_ context.Context, sel outbox.Select) (int64, error) {
	return m.dead(sel, func(r *outbox.Row) {
		delete(m.rows, r.ID)
		delete(m.byID, r.EventID)
	})
}
