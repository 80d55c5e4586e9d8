package outboxtest

import (
	"context"
	"database/sql"
	"errors"
)

// SQLInTx is Env.InTx for a database/sql store: fn runs in a transaction
// of db, committed when fn returns nil and rolled back otherwise.
func SQLInTx(db *sql.DB) func(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	return func(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if err := fn(ctx, tx); err != nil {
			return errors.Join(err, tx.Rollback())
		}
		return tx.Commit()
	}
}

// SQLRecord is Env.Record for a database/sql store: one row per id in
// table (a column named id, no unique constraint), in one transaction.
// table is the test's own constant, never user input.
func SQLRecord(db *sql.DB, table string) func(ctx context.Context, ids []string) error {
	in := SQLInTx(db)
	return func(ctx context.Context, ids []string) error {
		return in(ctx, func(ctx context.Context, tx *sql.Tx) error {
			for _, id := range ids {
				if _, err := tx.ExecContext(ctx, "INSERT INTO "+table+" (id) VALUES (?)", id); err != nil {
					return err
				}
			}
			return nil
		})
	}
}

// SQLRecorded is Env.Recorded for the table of [SQLRecord].
func SQLRecorded(db *sql.DB, table string) func(ctx context.Context) (map[string]int, error) {
	return func(ctx context.Context) (map[string]int, error) {
		rows, err := db.QueryContext(ctx, "SELECT id, COUNT(*) FROM "+table+" GROUP BY id")
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		out := map[string]int{}
		for rows.Next() {
			var (
				id string
				n  int
			)
			if err := rows.Scan(&id, &n); err != nil {
				return nil, err
			}
			out[id] = n
		}
		return out, rows.Err()
	}
}
