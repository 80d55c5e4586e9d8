package storekit

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"

	"github.com/idem-go/idem"
)

// ListExamine bounds how many records one [idem.Lister.List] call of a
// store built on [ListOrdered] reads from its backend, so that a filter
// that matches few records costs a bounded amount per page.
const ListExamine = 5000

// listBatch is how many records ListOrdered asks for at a time.
const listBatch = 500

// Position is a place in (scope, key) order: a listing resumes after it.
// The zero Position is before every record (keys are never empty).
type Position struct {
	Scope, Key string
}

// ReadAfter reads up to n records after pos, in (scope, key) order; it need
// not read their results. With scope set (the listing's filter names it),
// pos.Scope is that scope and it reads only that scope's records. Fewer
// than n records means there are no more.
type ReadAfter func(ctx context.Context, pos Position, scope string, n int) ([]idem.Record, error)

// ListOrdered implements [idem.Lister.List] for a store that can read its
// records in (scope, key) order: it validates req, reads batches after the
// cursor's position, keeps what req.Filter matches and stops at req.Limit
// records or [ListExamine] records read, whichever comes first. The cursor
// is the position of the last record read.
func ListOrdered(ctx context.Context, req idem.ListRequest, read ReadAfter) (idem.ListPage, error) {
	req, err := idem.ValidateList(req)
	if err != nil {
		return idem.ListPage{}, err
	}
	var pos Position
	if req.Cursor != "" {
		if pos, err = ParseCursor(req.Cursor); err != nil {
			return idem.ListPage{}, err
		}
	}
	f := req.Filter
	var page idem.ListPage
	switch {
	case f.Scope == "":
	case pos.Scope < f.Scope:
		// Jump straight to the scope (an empty key sorts before every key).
		pos = Position{Scope: f.Scope}
	case pos.Scope > f.Scope:
		return page, nil
	}
	for examined := 0; examined < ListExamine; {
		recs, err := read(ctx, pos, f.Scope, listBatch)
		if err != nil {
			return idem.ListPage{}, err
		}
		for _, rec := range recs {
			examined++
			pos = Position{Scope: rec.Scope, Key: rec.Key}
			if f.Match(rec) {
				rec.Result = nil
				page.Records = append(page.Records, rec)
				if len(page.Records) == req.Limit {
					page.Next = pos.Cursor()
					return page, nil
				}
			}
		}
		if len(recs) < listBatch {
			return page, nil
		}
	}
	page.Next = pos.Cursor()
	return page, nil
}

// cursorPrefix marks the cursors of ListOrdered, so that another store's
// cursor is refused instead of misread.
const cursorPrefix = "k1."

// Cursor encodes p as an opaque cursor.
func (p Position) Cursor() string {
	b := binary.AppendUvarint(nil, uint64(len(p.Scope)))
	b = append(b, p.Scope...)
	b = append(b, p.Key...)
	return cursorPrefix + base64.RawURLEncoding.EncodeToString(b)
}

// ParseCursor decodes a cursor of [Position.Cursor]. The error wraps
// idem.ErrInvalidConfig.
func ParseCursor(c string) (Position, error) {
	bad := func() (Position, error) {
		return Position{}, fmt.Errorf("%w: list cursor %q was not returned by this store", idem.ErrInvalidConfig, c)
	}
	if len(c) < len(cursorPrefix) || c[:len(cursorPrefix)] != cursorPrefix {
		return bad()
	}
	b, err := base64.RawURLEncoding.DecodeString(c[len(cursorPrefix):])
	if err != nil {
		return bad()
	}
	n, w := binary.Uvarint(b)
	if w <= 0 || n > uint64(len(b)-w) {
		return bad()
	}
	b = b[w:]
	return Position{Scope: string(b[:n]), Key: string(b[n:])}, nil
}
