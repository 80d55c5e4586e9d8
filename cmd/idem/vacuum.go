package main

import (
	"context"
	"fmt"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/idem-go/idem/store/idemsqlite"
	"github.com/jackc/pgx/v5"
)

// vacuumSQLite rewrites the database file without the pages purged records
// left free (VACUUM): SQLite reuses free pages for new records but gives
// them back to the file system only this way. It needs as much free disk
// as the database's size and blocks writers while it runs.
func vacuumSQLite(ctx context.Context, s idem.Store, _ storeConfig) (string, error) {
	st, ok := s.(*idemsqlite.Store)
	if !ok {
		return "", fmt.Errorf("vacuum: not a SQLite store (%T)", s)
	}
	db := st.DB()
	size := func() (pages, free, pageSize int64, err error) {
		if err = db.QueryRowContext(ctx, "PRAGMA page_count").Scan(&pages); err == nil {
			if err = db.QueryRowContext(ctx, "PRAGMA freelist_count").Scan(&free); err == nil {
				err = db.QueryRowContext(ctx, "PRAGMA page_size").Scan(&pageSize)
			}
		}
		return pages, free, pageSize, err
	}
	pages, free, pageSize, err := size()
	if err != nil {
		return "", fmt.Errorf("vacuum: %w", err)
	}
	if _, err := db.ExecContext(ctx, "VACUUM"); err != nil {
		return "", fmt.Errorf("vacuum: %w", err)
	}
	after, _, _, err := size()
	if err != nil {
		return "", fmt.Errorf("vacuum: %w", err)
	}
	return fmt.Sprintf("vacuumed %s: %s → %s (%d of %d pages were free)", st.Path(),
		byteSize(pages*pageSize), byteSize(after*pageSize), free, pages), nil
}

// vacuumPostgres runs VACUUM (ANALYZE) on the idem tables of the schema:
// the space of purged rows becomes reusable by new ones and the planner's
// statistics are fresh. The files shrink only where their end is free;
// VACUUM FULL would rewrite them under an exclusive lock, which is for a
// maintenance window, not for this command.
func vacuumPostgres(ctx context.Context, s idem.Store, cfg storeConfig) (string, error) {
	st, ok := s.(*idempgx.Store)
	if !ok {
		return "", fmt.Errorf("vacuum: not a PostgreSQL store (%T)", s)
	}
	pool, schema := st.Pool(), st.Config().Schema
	if schema == "" {
		schema = "public"
	}
	rows, err := pool.Query(ctx, `SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relkind = 'r' AND c.relname LIKE 'idem\_%' ORDER BY c.relname`, schema)
	if err != nil {
		return "", fmt.Errorf("vacuum: list the idem tables: %w", err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", fmt.Errorf("vacuum: list the idem tables: %w", err)
	}
	var total int64
	size := func() (int64, error) {
		total = 0
		for _, t := range tables {
			var n int64
			ident := pgx.Identifier{schema, t}.Sanitize()
			if err := pool.QueryRow(ctx, "SELECT pg_total_relation_size($1::regclass)", ident).Scan(&n); err != nil {
				return 0, err
			}
			total += n
		}
		return total, nil
	}
	before, err := size()
	if err != nil {
		return "", fmt.Errorf("vacuum: %w", err)
	}
	for _, t := range tables {
		if _, err := pool.Exec(ctx, "VACUUM (ANALYZE) "+pgx.Identifier{schema, t}.Sanitize()); err != nil {
			return "", fmt.Errorf("vacuum %s.%s: %w", schema, t, err)
		}
	}
	after, err := size()
	if err != nil {
		return "", fmt.Errorf("vacuum: %w", err)
	}
	return fmt.Sprintf("vacuumed %d idem tables in schema %s: %s → %s on disk; the space of purged rows is reusable by new ones "+
		"(VACUUM FULL, in a maintenance window, gives the rest back)", len(tables), schema, byteSize(before), byteSize(after)), nil
}

// byteSize prints n bytes for people.
func byteSize(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
