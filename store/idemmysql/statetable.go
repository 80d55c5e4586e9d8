package idemmysql

import (
	"context"
	"database/sql"
	"time"

	"github.com/idem-go/idem/internal/statetable"
)

// What the inbox and the outbox share as tables of rows with states:
// fenced lease filters and releases, counting by state, reading rows, and
// bounded batches of locked rows for purge, redrive and discard. Each table
// keeps its own SQL; table and state names below come from code, never
// from input.

// leaseFilter selects the rows of ls that are in the leased state (the
// inbox's 'running', the outbox's 'sending') by id and token.
func leaseFilter(state string, ls []statetable.Lease) (string, []any) {
	args := make([]any, 0, 3*len(ls))
	for _, l := range ls {
		args = append(args, l.ID)
	}
	for _, l := range ls {
		args = append(args, l.ID, l.Token)
	}
	return "id IN (" + placeholders(len(ls)) + ") AND state = '" + state + "' AND (" +
		repeatJoin("(id = ? AND token = ?)", " OR ", len(ls)) + ")", args
}

// releaseLeases gives the rows of ls whose lease is current back (pending,
// due now) and returns how many it released.
func (s *Store) releaseLeases(ctx context.Context, op, table, state string, ls []statetable.Lease) (int64, error) {
	if len(ls) == 0 {
		return 0, nil
	}
	where, args := leaseFilter(state, ls)
	res, err := s.db.ExecContext(ctx, "UPDATE "+table+" SET state = 'pending', next_attempt_at = "+nowSQL+" WHERE "+where, args...)
	if err != nil {
		return 0, s.wrap(op, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, s.wrap(op, err)
	}
	return n, nil
}

// queryRows runs a query of a table's columns and reads the rows with scan.
func queryRows[R any](ctx context.Context, q execer, scan func(scanner) (R, error), query string, args ...any) ([]R, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	var out []R
	err = eachRow(rows, func(r *sql.Rows) error {
		row, err := scan(r)
		out = append(out, row)
		return err
	})
	return out, err
}

// listRows is queryRows on the store's pool with the store's error
// wrapping.
func listRows[R any](ctx context.Context, s *Store, op string, scan func(scanner) (R, error), query string, args ...any) ([]R, error) {
	out, err := queryRows(ctx, s.db, scan, query, args...)
	if err != nil {
		return nil, s.wrap(op, err)
	}
	return out, nil
}

// purgeFinished deletes the rows of table in state (a final one) whose
// column at is older than olderThan, in batches of at most limit rows,
// each locked with SKIP LOCKED and deleted in a short transaction of its
// own; then the spent rows of the table's token counter, tokens.
func (s *Store) purgeFinished(ctx context.Context, op, table, state, at, tokens string, olderThan time.Duration, limit int) (int64, error) {
	n, err := s.batches(ctx, op, limit, func(tx *sql.Tx) (int64, error) {
		return deleteLocked(ctx, tx, table, "SELECT id FROM "+table+" WHERE state = '"+state+"' AND "+at+" <= "+nowSQL+
			" - INTERVAL ? MICROSECOND ORDER BY "+at+" LIMIT ? FOR UPDATE SKIP LOCKED", micros(olderThan), limit)
	})
	if err != nil {
		return n, err
	}
	return n, s.purgeTokens(ctx, tokens)
}

// deleteLocked deletes the rows of table whose ids query selects (and
// locks).
func deleteLocked(ctx context.Context, tx *sql.Tx, table, query string, args ...any) (int64, error) {
	ids, err := lockedIDs(ctx, tx, query, args...)
	if err != nil || len(ids) == 0 {
		return 0, err
	}
	res, err := tx.ExecContext(ctx, "DELETE FROM "+table+" WHERE id IN ("+placeholders(len(ids))+")", ids...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// lockedIDs runs a query of ids.
func lockedIDs(ctx context.Context, tx *sql.Tx, query string, args ...any) ([]any, error) {
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	var ids []any
	err = eachRow(rows, func(r *sql.Rows) error {
		var id int64
		err := r.Scan(&id)
		ids = append(ids, id)
		return err
	})
	return ids, err
}

// deadBatches locks the dead rows of table that sel names, a bounded batch
// (limit) at a time (SKIP LOCKED), and applies change to them, each batch in
// a short transaction, so that redriving or discarding a large dead set
// never holds one long transaction.
func (s *Store) deadBatches(ctx context.Context, op, table string, sel statetable.Select, limit int,
	change func(tx *sql.Tx, ids []any) (sql.Result, error)) (int64, error) {
	query := "SELECT id FROM " + table + " WHERE state = 'dead'"
	var args []any
	if !sel.All {
		query += " AND id IN (" + placeholders(len(sel.IDs)) + ")"
		for _, id := range sel.IDs {
			args = append(args, id)
		}
	}
	query += " ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED"
	args = append(args, limit)
	return s.batches(ctx, op, limit, func(tx *sql.Tx) (int64, error) {
		ids, err := lockedIDs(ctx, tx, query, args...)
		if err != nil || len(ids) == 0 {
			return 0, err
		}
		res, err := change(tx, ids)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	})
}

// countStates runs a stats query (state, count, age of the oldest row in
// microseconds) and lists every one of states in order.
func countStates[S ~string](ctx context.Context, s *Store, op, query string, states []S) ([]statetable.Count[S], error) {
	rows, err := s.db.QueryContext(ctx, query)
	if err != nil {
		return nil, s.wrap(op, err)
	}
	by := statetable.Tally[S]{}
	err = eachRow(rows, func(r *sql.Rows) error {
		var (
			state string
			n, us int64
		)
		if err := r.Scan(&state, &n, &us); err != nil {
			return err
		}
		by.Add(state, n, time.Duration(us)*time.Microsecond)
		return nil
	})
	if err != nil {
		return nil, s.wrap(op, err)
	}
	return by.In(states), nil
}
