package idemsqlite

import (
	"context"
	"database/sql"
	"errors"
	"sync"
)

// hotStmts are the statements of the claim and complete paths, prepared
// once per connection instead of once per call: parsing and planning
// them was a sixth of the CPU time of an HTTP first execution (measured
// with BenchmarkHTTPSideBySide). Only the store's own constant queries
// are kept, so the set is bounded.
type hotStmts struct {
	mu        sync.Mutex
	m         map[string]*sql.Stmt
	preparing map[string]bool
	closed    bool
	inflight  sync.WaitGroup
}

// stmt returns the statement of query prepared on db, or nil while it is
// not (the caller then runs the query as it is, and meets any error
// there). The first call for a query prepares it in the background:
// preparing takes a connection of the pool, and a caller that already
// holds one (a transaction, a member of a shared transaction) must never
// wait for another. With every connection held by such callers that wait
// would never end; it did, under 40 concurrent Process calls.
func (h *hotStmts) stmt(db *sql.DB, query string) *sql.Stmt {
	h.mu.Lock()
	defer h.mu.Unlock()
	if st, ok := h.m[query]; ok {
		return st
	}
	if h.closed || h.preparing[query] {
		return nil
	}
	if h.preparing == nil {
		h.preparing = map[string]bool{}
	}
	h.preparing[query] = true
	h.inflight.Go(func() {
		// Not the caller's context: the statement outlives the call. A
		// closed pool ends the wait for a connection.
		st, err := db.PrepareContext(context.Background(), query)
		h.mu.Lock()
		defer h.mu.Unlock()
		delete(h.preparing, query)
		switch {
		case err != nil: // the next call tries again
		case h.closed:
			_ = st.Close()
		default:
			if h.m == nil {
				h.m = map[string]*sql.Stmt{}
			}
			h.m[query] = st
		}
	})
	return nil
}

// settle waits for the preparations in flight.
func (h *hotStmts) settle() { h.inflight.Wait() }

// close closes every prepared statement, after the preparations in flight.
func (h *hotStmts) close() error {
	h.mu.Lock()
	h.closed = true
	h.mu.Unlock()
	h.inflight.Wait()
	h.mu.Lock()
	defer h.mu.Unlock()
	var errs []error
	for q, st := range h.m {
		errs = append(errs, st.Close())
		delete(h.m, q)
	}
	return errors.Join(errs...)
}

// hotQuerier runs queries through the store's prepared statements, on a
// transaction (tx) or on the pool.
type hotQuerier struct {
	s  *Store
	tx *sql.Tx
}

// hot returns a querier over tx, or over the pool when tx is nil.
func (s *Store) hot(tx *sql.Tx) hotQuerier { return hotQuerier{s, tx} }

func (q hotQuerier) prepared(ctx context.Context, query string) *sql.Stmt {
	if q.s.closed.Load() {
		return nil // Close has closed the statements; prepare no more
	}
	st := q.s.stmts.stmt(q.s.db, query)
	if st != nil && q.tx != nil {
		st = q.tx.StmtContext(ctx, st)
	}
	return st
}

func (q hotQuerier) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if st := q.prepared(ctx, query); st != nil {
		return st.QueryRowContext(ctx, args...)
	}
	if q.tx != nil {
		return q.tx.QueryRowContext(ctx, query, args...)
	}
	return q.s.db.QueryRowContext(ctx, query, args...)
}

func (q hotQuerier) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if st := q.prepared(ctx, query); st != nil {
		return st.ExecContext(ctx, args...)
	}
	if q.tx != nil {
		return q.tx.ExecContext(ctx, query, args...)
	}
	return q.s.db.ExecContext(ctx, query, args...)
}
