package idem

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"
)

// Lister is implemented by stores that can list their records, for
// operators ("idem keys list", "idem keys find") rather than for the hot
// path. idempgx, idemsqlite, idemredis and idemtest's memory store
// implement it; idemtest/storetest.RunList checks an implementation.
type Lister interface {
	// List returns one page of the records that match req.Filter, without
	// their results (Record.Result is nil: [Store.Get] reads one), and the
	// cursor of the next page. A store bounds what one call examines, so a
	// page may hold fewer than req.Limit records, even none, while
	// ListPage.Next is not empty: keep calling until Next is empty.
	//
	// Records come once each in (scope, key) order from SQL stores and the
	// memory store; Redis returns them in its SCAN order, and a record
	// written or deleted while a listing runs may be listed or not (Redis
	// may even list one twice). Expired records not purged yet are listed.
	List(ctx context.Context, req ListRequest) (ListPage, error)
}

// DefaultListLimit is the page size of a [ListRequest] with Limit 0, and
// MaxListLimit the largest Limit a store accepts.
const (
	DefaultListLimit = 100
	MaxListLimit     = 1000
)

// ListRequest asks a [Lister] for one page of records.
type ListRequest struct {
	Filter ListFilter
	// Limit is the most records the page holds: 0 means DefaultListLimit;
	// more than MaxListLimit is refused.
	Limit int
	// Cursor is the ListPage.Next of the previous page, empty for the
	// first. It is opaque and only means something to the store (and
	// filter) that returned it.
	Cursor string
}

// ListPage is one page of a listing.
type ListPage struct {
	// Records match the filter; their Result is nil.
	Records []Record
	// Next is the cursor of the following page; empty when the listing is
	// complete.
	Next string
}

// ListFilter selects records. Every field that is set must match; the
// zero filter matches every record.
type ListFilter struct {
	// Key and Scope match exactly; KeyPrefix and ScopePrefix match the
	// start of the key and scope.
	Key, KeyPrefix     string
	Scope, ScopePrefix string
	// ScopeHash matches the scopes whose hash is this: the first 8 bytes of
	// SHA-256(scope) in 16 lowercase hex digits, which is what the HTTP
	// middleware's and the proxy's logs print as scope_hash
	// (the scope_hash of idemhttp's logs and events). See [ScopeHash].
	ScopeHash string
	// State is StateInProgress or StateCompleted; empty matches both.
	State State
	// CreatedAfter and CreatedBefore bound Record.CreatedAt (after is
	// inclusive, before exclusive); zero means unbounded.
	CreatedAfter, CreatedBefore time.Time
	// ExpiresAfter and ExpiresBefore bound Record.ExpiresAt the same way.
	ExpiresAfter, ExpiresBefore time.Time
}

// ScopeHash returns the hash of scope that [ListFilter.ScopeHash] matches:
// the first 8 bytes of SHA-256(scope) in 16 lowercase hex digits.
func ScopeHash(scope string) string {
	h := sha256.Sum256([]byte(scope))
	return hex.EncodeToString(h[:8])
}

// Match reports whether rec passes every condition of f.
func (f ListFilter) Match(rec Record) bool {
	switch {
	case f.Key != "" && rec.Key != f.Key,
		f.Scope != "" && rec.Scope != f.Scope,
		!strings.HasPrefix(rec.Key, f.KeyPrefix),
		!strings.HasPrefix(rec.Scope, f.ScopePrefix),
		f.State != "" && rec.State != f.State,
		!inRange(rec.CreatedAt, f.CreatedAfter, f.CreatedBefore),
		!inRange(rec.ExpiresAt, f.ExpiresAfter, f.ExpiresBefore):
		return false
	}
	return f.ScopeHash == "" || ScopeHash(rec.Scope) == f.ScopeHash
}

func inRange(t, after, before time.Time) bool {
	return (after.IsZero() || !t.Before(after)) && (before.IsZero() || t.Before(before))
}

// ValidateList checks req before a store touches its backend and returns
// it with Limit defaulted. Errors wrap [ErrInvalidConfig].
func ValidateList(req ListRequest) (ListRequest, error) {
	f := req.Filter
	switch {
	case req.Limit < 0 || req.Limit > MaxListLimit:
		return req, fmt.Errorf("%w: list limit must be between 1 and %d (0 for %d), got %d", ErrInvalidConfig, MaxListLimit, DefaultListLimit, req.Limit)
	case f.State != "" && f.State != StateInProgress && f.State != StateCompleted:
		return req, fmt.Errorf("%w: list state must be %q or %q, got %q", ErrInvalidConfig, StateInProgress, StateCompleted, f.State)
	case f.ScopeHash != "" && !isScopeHash(f.ScopeHash):
		return req, fmt.Errorf("%w: a scope hash is 16 lowercase hex digits, got %q", ErrInvalidConfig, f.ScopeHash)
	}
	if req.Limit == 0 {
		req.Limit = DefaultListLimit
	}
	return req, nil
}

func isScopeHash(s string) bool {
	if len(s) != 16 {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
