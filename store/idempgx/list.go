package idempgx

import (
	"context"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/storekit"
	"github.com/jackc/pgx/v5"
)

var _ idem.Lister = (*Store)(nil)

// listColumns is recordColumns without the result, which a listing does
// not carry.
const listColumns = `scope, key, state, fingerprint, token, NULL::bytea, failed, tombstone,
	created_at, lease_expires_at, completed_at, expires_at`

// listQueries walk the primary key (scope, key) from a position, the
// whole table or one scope; every other condition of a filter is applied
// to the rows read (see storekit.ListOrdered), which bounds what one call
// costs whatever the filter.
func listQueries(t string) (all, scope string) {
	return `SELECT ` + listColumns + ` FROM ` + t + ` WHERE (scope, key) > ($1, $2) ORDER BY scope, key LIMIT $3`,
		`SELECT ` + listColumns + ` FROM ` + t + ` WHERE scope = $1 AND key > $2 ORDER BY key LIMIT $3`
}

// List implements [idem.Lister] in (scope, key) order (the order of the
// database's collation). A call reads at most storekit.ListExamine rows
// over the primary key, so a page of a filter that matches few records may
// be short or empty while it has a next cursor. It takes one connection of
// those open to claims (see Config.HolderConns).
func (s *Store) List(ctx context.Context, req idem.ListRequest) (idem.ListPage, error) {
	return storekit.ListOrdered(ctx, req, s.readAfter)
}

func (s *Store) readAfter(ctx context.Context, pos storekit.Position, scope string, n int) ([]idem.Record, error) {
	conn, err := s.conn(ctx, "list", false)
	if err != nil {
		return nil, err
	}
	defer s.done(conn, false)
	q := s.q.listAll
	if scope != "" {
		q = s.q.listScope
	}
	rows, err := conn.Query(ctx, q, pos.Scope, pos.Key, n)
	if err != nil {
		return nil, s.wrap("list", err)
	}
	recs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (idem.Record, error) { return scanRecord(row) })
	if err != nil {
		return nil, s.wrap("list", err)
	}
	return recs, nil
}
