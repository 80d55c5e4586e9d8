// Package statetable is what the inbox and the outbox share as tables of
// rows with states: rows leased by id and fencing token, counted by state,
// listed by state in pages of ids, and dead rows selected by id or all at
// once. inbox/inboxdriver and outbox/outboxdriver declare their public
// names over it (type aliases, thin wrappers), each with its own State
// type and its own error prefix ("inbox", "outbox"); the stores use it
// through those names.
//
// It holds only what has the same meaning in both tables. What differs
// stays with each table: the states themselves, what a claim in ordered
// mode holds back, how failures are recorded (one row at a time in the
// inbox, with history; in batches in the outbox), and what a purge deletes.
package statetable

import (
	"fmt"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/textcut"
)

// MaxBatch is the largest claim, list or selection of either table.
const MaxBatch = 1000

// MaxErrorBytes bounds a stored error text (last_error, the attempt
// history); longer texts are cut.
const MaxErrorBytes = 2048

// DefaultListLimit is the limit of a ListRequest whose Limit is 0.
const DefaultListLimit = 100

// Count is one line of a table's Stats.
type Count[S ~string] struct {
	State S
	Count int64
	// Oldest is the age, by the database clock, of the oldest row in the
	// state (by the time it entered the table: received or written); zero
	// when Count is 0.
	Oldest time.Duration
}

// ListRequest selects rows in a state for a table's List.
type ListRequest[S ~string] struct {
	State S
	// AfterID pages: only rows with a larger id.
	AfterID int64
	// Limit is 1..MaxBatch; 0 means 100.
	Limit int
}

// Lease identifies one claimed row: its id and the fencing token of the
// claim.
type Lease struct {
	ID    int64
	Token int64
}

// LeaseArrays splits ls into its ids and its tokens, in order.
func LeaseArrays(ls []Lease) (ids, tokens []int64) {
	ids, tokens = make([]int64, len(ls)), make([]int64, len(ls))
	for i, l := range ls {
		ids[i], tokens[i] = l.ID, l.Token
	}
	return ids, tokens
}

// Select names dead rows for Redrive and Discard: the given ids, or every
// dead row with All.
type Select struct {
	IDs []int64
	All bool
}

// CutError bounds an error text to MaxErrorBytes without splitting a UTF-8
// sequence.
func CutError(s string) string { return textcut.Cut(s, MaxErrorBytes) }

// ValidateSelect checks a Redrive or Discard selection; table prefixes the
// error ("inbox", "outbox").
func ValidateSelect(table string, sel Select) error {
	if sel.All == (len(sel.IDs) > 0) {
		return fmt.Errorf("%w: %s: give ids or All, not both or neither", idem.ErrInvalidConfig, table)
	}
	if len(sel.IDs) > MaxBatch {
		return fmt.Errorf("%w: %s: at most %d ids at once", idem.ErrInvalidConfig, table, MaxBatch)
	}
	return nil
}

// ValidateClaim checks the limit and the lease of a claim.
func ValidateClaim(table string, limit int, lease time.Duration) error {
	if limit < 1 || limit > MaxBatch {
		return fmt.Errorf("%w: %s: claim limit must be 1..%d, got %d", idem.ErrInvalidConfig, table, MaxBatch, limit)
	}
	if lease <= 0 {
		return fmt.Errorf("%w: %s: lease must be positive, got %v", idem.ErrInvalidConfig, table, lease)
	}
	return nil
}

// ListLimit returns the effective limit of req, or an error.
func ListLimit[S ~string](table string, req ListRequest[S]) (int, error) {
	switch {
	case req.Limit == 0:
		return DefaultListLimit, nil
	case req.Limit < 0 || req.Limit > MaxBatch:
		return 0, fmt.Errorf("%w: %s: list limit must be 1..%d, got %d", idem.ErrInvalidConfig, table, MaxBatch, req.Limit)
	}
	return req.Limit, nil
}

// StatsInOrder lists every one of states in order, taking counts from by
// (a state missing from by counts zero).
func StatsInOrder[S ~string](states []S, by map[S]Count[S]) []Count[S] {
	out := make([]Count[S], len(states))
	for i, st := range states {
		c := by[st]
		c.State = st
		out[i] = c
	}
	return out
}

// Tally gathers the lines of a Stats query (state, count, age of the
// oldest row) for [StatsInOrder].
type Tally[S ~string] map[S]Count[S]

// Add records one line.
func (t Tally[S]) Add(state string, n int64, oldest time.Duration) {
	t[S(state)] = Count[S]{State: S(state), Count: n, Oldest: oldest}
}

// In lists every one of states in order (see [StatsInOrder]).
func (t Tally[S]) In(states []S) []Count[S] { return StatsInOrder(states, t) }
