package idempgx

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/storekit"
	"github.com/jackc/pgx/v5"
)

// Heartbeats share statements. A process that holds many leases (idem
// proxy, a consumer with a large batch in flight, the HTTP middleware under
// load) heartbeats them all every Lease/3, and the leases it took in one
// burst fall due together. Sent one by one, each heartbeat paid its own
// statement and its own commit (a WAL flush) on a pool connection, and a
// burst of hundreds queued behind each other for longer than a short
// lease's heartbeat period. Concurrent Extends are instead sent as one
// UPDATE over arrays (see [storekit.Coalescer]): a lone Extend is still
// one statement of its own, at once.
const (
	// extendBatch bounds the leases one statement extends.
	extendBatch = 512
	// extendsInFlight is how many heartbeat statements a store keeps in
	// flight: two keep the server busy while the previous answer travels
	// back, and leave the other holder connections to completions and
	// releases.
	extendsInFlight = 2
)

// extendCall is one Store.Extend on its way to the server.
type extendCall struct {
	storekit.Pending
	scope, key   string
	token, lease int64 // lease in microseconds
	until        time.Time
}

// newExtends sets up the store's heartbeat coalescer.
func (s *Store) newExtends() {
	s.extends = &storekit.Coalescer[*extendCall]{MaxBatch: extendBatch, InFlight: extendsInFlight, Exec: s.execExtends,
		Wrap: func(err error) error { return s.wrap("extend", err) }}
}

// Extend implements [idem.Store]. Concurrent Extends share one statement
// and one commit.
func (s *Store) Extend(ctx context.Context, scope, key string, token int64, lease time.Duration) (time.Time, error) {
	if err := idem.Validate(scope, key); err != nil {
		return time.Time{}, err
	}
	if lease <= 0 {
		return time.Time{}, fmt.Errorf("%w: lease must be positive, got %v", idem.ErrInvalidConfig, lease)
	}
	c := &extendCall{scope: scope, key: key, token: token, lease: micros(lease)}
	if err := s.extends.Do(ctx, c); err != nil {
		// c may still be in flight: its sender writes c.until.
		return time.Time{}, err
	}
	return c.until, nil
}

// execExtends extends the leases of calls, one statement for all, and sets
// each call's until or error.
func (s *Store) execExtends(ctx context.Context, calls []*extendCall) {
	if len(calls) > 1 {
		// A group's context does not end with any caller's: it ends with the
		// last of their deadlines, so that a server that stops answering
		// cannot hold the statement, and the connection, for ever.
		if last, ok := lastDeadline(calls); ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, last)
			defer cancel()
		}
	}
	conn, err := s.conn(ctx, "extend", true)
	if err != nil {
		failExtends(calls, err)
		return
	}
	defer s.done(conn, true)
	if len(calls) == 1 {
		c := calls[0]
		err := conn.QueryRow(ctx, s.q.extend, c.scope, c.key, c.token, c.lease).Scan(&c.until)
		if errors.Is(err, pgx.ErrNoRows) {
			c.Err = fmt.Errorf("idempgx: extend %q: %w", c.key, idem.ErrLeaseLost)
		} else if err != nil {
			c.Err = s.wrap("extend", err)
		}
		return
	}
	// Sorted by (scope, key), so that concurrent statements lock their rows
	// in the same order.
	slices.SortFunc(calls, func(a, b *extendCall) int {
		return cmp.Or(cmp.Compare(a.scope, b.scope), cmp.Compare(a.key, b.key), cmp.Compare(a.token, b.token))
	})
	n := len(calls)
	scopes, keys, tokens, leases := make([]string, n), make([]string, n), make([]int64, n), make([]int64, n)
	for i, c := range calls {
		scopes[i], keys[i], tokens[i], leases[i] = c.scope, c.key, c.token, c.lease
	}
	type held struct {
		scope, key string
		token      int64
	}
	extended := make(map[held]time.Time, n)
	rows, err := conn.Query(ctx, s.q.extendBatch, scopes, keys, tokens, leases)
	if err == nil {
		var h held
		var until time.Time
		_, err = pgx.ForEachRow(rows, []any{&h.scope, &h.key, &h.token, &until}, func() error {
			extended[h] = until
			return nil
		})
	}
	if err != nil {
		failExtends(calls, s.wrap("extend", err))
		return
	}
	// A lease extended twice in one statement (two heartbeats of one
	// holder at once) is updated once; both calls get its new expiry.
	for _, c := range calls {
		if until, ok := extended[held{c.scope, c.key, c.token}]; ok {
			c.until, c.Err = until, nil
		} else {
			c.Err = fmt.Errorf("idempgx: extend %q: %w", c.key, idem.ErrLeaseLost)
		}
	}
}

// lastDeadline returns the latest deadline of the calls' contexts, and
// false when one of them has none.
func lastDeadline(calls []*extendCall) (time.Time, bool) {
	var last time.Time
	for _, c := range calls {
		d, ok := c.Context().Deadline()
		if !ok {
			return time.Time{}, false
		}
		if d.After(last) {
			last = d
		}
	}
	return last, true
}

// failExtends gives every call of a failed statement its error.
func failExtends(calls []*extendCall, err error) {
	for _, c := range calls {
		c.Err = err
	}
}
