package idemsqlite

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/idem-go/idem/internal/statetable"
)

// stateTable is what the inbox and the outbox share as tables of rows with
// states: error wrapping, fenced statements per lease, counting by state,
// reading rows, and bounded batches for purge, redrive and discard. Each
// table keeps its own SQL.
type stateTable struct {
	s    *Store
	name string // "idem_inbox", "idem_outbox"
}

// wrap names the operation and says to migrate when the table is missing.
func (t stateTable) wrap(op string, err error) error {
	if strings.Contains(err.Error(), "no such table: "+t.name) {
		return fmt.Errorf("idemsqlite: %s: %w: run `idem migrate up --store sqlite://…` (%w)", op, ErrNotMigrated, err)
	}
	return fmt.Errorf("idemsqlite: %s: %w", op, classify(err))
}

// held runs stmt once per lease, fenced by its id and token (the last two
// parameters; args gives those before them), in one lease holder's
// transaction, and returns the ids it changed: the others' leases were
// lost. Lease holders (heartbeats, marks, releases) go ahead of claims in
// the write queue, so a burst of claims cannot make them lose a lease.
func (t stateTable) held(ctx context.Context, op string, ls []statetable.Lease, stmt string, args func(i int, now int64) []any) ([]int64, error) {
	if len(ls) == 0 {
		return nil, nil
	}
	var done []int64
	err := t.s.inHolderTx(ctx, op, func(ctx context.Context, tx *sql.Tx, now int64) error {
		done = done[:0]
		for i, l := range ls {
			res, err := tx.ExecContext(ctx, stmt, append(args(i, now), l.ID, l.Token)...)
			if err != nil {
				return t.wrap(op, err)
			}
			n, err := res.RowsAffected()
			if err != nil {
				return t.wrap(op, err)
			}
			if n > 0 {
				done = append(done, l.ID)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return done, nil
}

// batches is Store.inBatches with the table's error wrapping.
func (t stateTable) batches(ctx context.Context, op string, limit int, stmt func(tx *sql.Tx, now int64) (sql.Result, error)) (int64, error) {
	return t.s.inBatches(ctx, op, limit, func(tx *sql.Tx, now int64) (sql.Result, error) {
		res, err := stmt(tx, now)
		if err != nil {
			return nil, t.wrap(op, err)
		}
		return res, nil
	})
}

// deadBatches runs a redrive or discard over the dead rows sel names,
// DefaultPurgeBatch rows per transaction: head gives the statement up to
// "WHERE id IN " and its arguments.
func (t stateTable) deadBatches(ctx context.Context, op string, sel statetable.Select, head func(now int64) (string, []any)) (int64, error) {
	// The ids go in as one JSON array parameter, never spliced into SQL.
	ids := make([]string, len(sel.IDs))
	for i, id := range sel.IDs {
		ids[i] = fmt.Sprint(id)
	}
	idsJSON := "[" + strings.Join(ids, ",") + "]"
	limit := DefaultPurgeBatch
	return t.batches(ctx, op, limit, func(tx *sql.Tx, now int64) (sql.Result, error) {
		stmt, args := head(now)
		return tx.ExecContext(ctx, stmt+`(SELECT id FROM `+t.name+` WHERE state = 'dead'
	AND (? OR id IN (SELECT value FROM json_each(?))) ORDER BY id LIMIT ?)`, append(args, sel.All, idsJSON, limit)...)
	})
}

// countStates runs a stats query (state, count, the oldest row's time in
// microseconds) and lists every one of states in order.
func countStates[S ~string](ctx context.Context, t stateTable, op, query string, states []S) ([]statetable.Count[S], error) {
	rows, err := t.s.db.QueryContext(ctx, query)
	if err != nil {
		return nil, t.wrap(op, err)
	}
	defer rows.Close()
	now := t.s.now()
	by := statetable.Tally[S]{}
	for rows.Next() {
		var (
			state     string
			n, oldest int64
		)
		if err := rows.Scan(&state, &n, &oldest); err != nil {
			return nil, t.wrap(op, err)
		}
		by.Add(state, n, now.Sub(time.UnixMicro(oldest)))
	}
	if err := rows.Err(); err != nil {
		return nil, t.wrap(op, err)
	}
	return by.In(states), nil
}

// listRows reads the rows of a query with scan.
func listRows[R any](ctx context.Context, t stateTable, op string, scan func(scanner) (R, error), query string, args ...any) ([]R, error) {
	rows, err := t.s.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, t.wrap(op, err)
	}
	defer rows.Close()
	var out []R
	for rows.Next() {
		r, err := scan(rows)
		if err != nil {
			return nil, t.wrap(op, err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, t.wrap(op, err)
	}
	return out, nil
}
