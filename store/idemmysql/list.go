package idemmysql

import (
	"context"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/storekit"
)

var _ idem.Lister = (*Store)(nil)

// listColumns is recordColumns without the result, which a listing does
// not carry.
const listColumns = "r.scope, r.`key`, r.state, r.fingerprint, r.token, NULL, r.failed, r.tombstone, " +
	"r.created_at, r.lease_expires_at, r.completed_at, r.expires_at"

// The listing walks the primary key (scope, key) from a position, over the
// whole table or one scope; every other condition of a filter is applied
// to the rows read (see storekit.ListOrdered), which bounds what one call
// costs whatever the filter. Scope and key are VARBINARY, so the order is
// by bytes, as the other stores'.
const (
	listAllQuery = "SELECT " + listColumns + " FROM idem_records AS r WHERE r.scope > ? OR (r.scope = ? AND r.`key` > ?) " +
		"ORDER BY r.scope, r.`key` LIMIT ?"
	listScopeQuery = "SELECT " + listColumns + " FROM idem_records AS r WHERE r.scope = ? AND r.`key` > ? ORDER BY r.`key` LIMIT ?"
)

// List implements [idem.Lister] in (scope, key) order, by bytes. A call
// reads at most storekit.ListExamine rows over the primary key, with the
// pool connections claims use (never the lease holders'), so a page of a
// filter that matches few records may be short or empty while it has a
// next cursor.
func (s *Store) List(ctx context.Context, req idem.ListRequest) (idem.ListPage, error) {
	return storekit.ListOrdered(ctx, req, s.readAfter)
}

func (s *Store) readAfter(ctx context.Context, pos storekit.Position, scope string, n int) ([]idem.Record, error) {
	var recs []idem.Record
	err := s.gated(ctx, "list", func() error {
		q, args := listAllQuery, []any{[]byte(pos.Scope), []byte(pos.Scope), []byte(pos.Key), n}
		if scope != "" {
			q, args = listScopeQuery, []any{[]byte(pos.Scope), []byte(pos.Key), n}
		}
		rows, err := s.db.QueryContext(ctx, q, args...)
		if err != nil {
			return s.wrap("list", err)
		}
		defer rows.Close()
		for rows.Next() {
			rec, err := scanRecord(rows)
			if err != nil {
				return s.wrap("list", err)
			}
			recs = append(recs, rec)
		}
		if err := rows.Err(); err != nil {
			return s.wrap("list", err)
		}
		return nil
	})
	return recs, err
}
