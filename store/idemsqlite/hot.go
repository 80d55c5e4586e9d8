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
	mu sync.Mutex
	m  map[string]*sql.Stmt
}

// stmt returns the statement of query prepared on db, preparing it the
// first time; nil when it cannot be (the caller then runs the query as it
// is, and meets the error there).
func (h *hotStmts) stmt(ctx context.Context, db *sql.DB, query string) *sql.Stmt {
	h.mu.Lock()
	defer h.mu.Unlock()
	if st, ok := h.m[query]; ok {
		return st
	}
	st, err := db.PrepareContext(ctx, query)
	if err != nil {
		return nil
	}
	if h.m == nil {
		h.m = map[string]*sql.Stmt{}
	}
	h.m[query] = st
	return st
}

// close closes every prepared statement.
func (h *hotStmts) close() error {
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
	st := q.s.stmts.stmt(ctx, q.s.db, query)
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
