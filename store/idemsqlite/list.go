package idemsqlite

import (
	"context"
	"fmt"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/storekit"
)

var _ idem.Lister = (*Store)(nil)

// listColumns is recordColumns without the result, which a listing does
// not carry.
const listColumns = `scope, key, state, fingerprint, token, NULL, failed, tombstone,
	created_at, lease_expires_at, completed_at, expires_at`

// The listing walks the primary key (scope, key) from a position, over the
// whole table or one scope; every other condition of a filter is applied
// to the rows read (see storekit.ListOrdered), which bounds what one call
// costs whatever the filter.
const (
	listAllQuery   = `SELECT ` + listColumns + ` FROM idem_records WHERE (scope, key) > (?, ?) ORDER BY scope, key LIMIT ?`
	listScopeQuery = `SELECT ` + listColumns + ` FROM idem_records WHERE scope = ? AND key > ? ORDER BY key LIMIT ?`
)

// List implements [idem.Lister] in (scope, key) order, by bytes. A call
// reads at most storekit.ListExamine rows over the primary key, outside
// the write queue, so a page of a filter that matches few records may be
// short or empty while it has a next cursor.
func (s *Store) List(ctx context.Context, req idem.ListRequest) (idem.ListPage, error) {
	if err := s.checkOpen(); err != nil {
		return idem.ListPage{}, err
	}
	return storekit.ListOrdered(ctx, req, s.readAfter)
}

func (s *Store) readAfter(ctx context.Context, pos storekit.Position, scope string, n int) ([]idem.Record, error) {
	q := listAllQuery
	if scope != "" {
		q = listScopeQuery
	}
	rows, err := s.db.QueryContext(ctx, q, pos.Scope, pos.Key, n)
	if err != nil {
		return nil, fmt.Errorf("idemsqlite: list: %w", classify(err))
	}
	defer rows.Close()
	var recs []idem.Record
	for rows.Next() {
		rec, err := scanRecord(rows)
		if err != nil {
			return nil, fmt.Errorf("idemsqlite: list: %w", classify(err))
		}
		recs = append(recs, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("idemsqlite: list: %w", classify(err))
	}
	return recs, nil
}
