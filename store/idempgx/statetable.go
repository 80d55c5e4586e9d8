package idempgx

import (
	"context"
	"fmt"
	"time"

	"github.com/idem-go/idem/internal/statetable"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// What the inbox and the outbox share as tables of rows with states:
// counting by state, reading rows, and bounded batches for purge, redrive
// and discard. Each table keeps its own SQL.

// tableBatches runs a bounded statement, each time in its own
// transaction, until it affects fewer rows than limit.
func (s *Store) tableBatches(ctx context.Context, op string, limit int, exec func() (pgconn.CommandTag, error)) (int64, error) {
	var total int64
	for {
		tag, err := exec()
		if err != nil {
			return total, s.wrap(op, err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(limit) {
			return total, nil
		}
		if err := ctx.Err(); err != nil {
			return total, fmt.Errorf("idempgx: %s: %w", op, err)
		}
	}
}

// deadBatches runs a redrive or discard statement over the dead rows sel
// names, limit rows at a time (its parameters: $1 the ids, $2 all, $3 the
// limit), so that a large dead set never holds one long transaction.
func (s *Store) deadBatches(ctx context.Context, op, sql string, sel statetable.Select, limit int) (int64, error) {
	ids := sel.IDs
	if ids == nil {
		ids = []int64{}
	}
	return s.tableBatches(ctx, op, limit, func() (pgconn.CommandTag, error) {
		return s.pool.Exec(ctx, sql, ids, sel.All, limit)
	})
}

// countStates runs a stats query (state, count, age of the oldest row in
// seconds) and lists every one of states in order.
func countStates[S ~string](ctx context.Context, s *Store, op, query string, states []S) ([]statetable.Count[S], error) {
	rows, err := s.pool.Query(ctx, query)
	if err != nil {
		return nil, s.wrap(op, err)
	}
	by := statetable.Tally[S]{}
	var (
		state string
		n     int64
		age   float64
	)
	_, err = pgx.ForEachRow(rows, []any{&state, &n, &age}, func() error {
		by.Add(state, n, time.Duration(age*float64(time.Second)))
		return nil
	})
	if err != nil {
		return nil, s.wrap(op, err)
	}
	return by.In(states), nil
}

// collectRows reads the rows of a query (rows, err: its result) with scan.
func collectRows[R any](s *Store, op string, scan func(pgx.Row) (R, error), rows pgx.Rows, err error) ([]R, error) {
	if err != nil {
		return nil, s.wrap(op, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (R, error) { return scan(r) })
	if err != nil {
		return nil, s.wrap(op, err)
	}
	return out, nil
}
