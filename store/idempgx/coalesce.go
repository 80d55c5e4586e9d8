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
	"github.com/jackc/pgx/v5/pgxpool"
)

// Lease holders' writes share statements. A process that holds many
// leases (idem proxy, a consumer with a large batch in flight, the HTTP
// middleware under load) heartbeats them all every Lease/3, and the leases
// it took in one burst fall due together, and often complete together.
// Sent one by one, each heartbeat and each completion paid its own
// statement and its own commit (a WAL flush) on a pool connection, and a
// burst of hundreds queued behind each other for longer than a short
// lease's heartbeat period. Concurrent Extends, and concurrent Completes,
// are instead sent as one UPDATE over arrays each (see
// [storekit.Coalescer]): a lone call is still one statement of its own,
// sent at once.
const (
	// holderBatch bounds the leases one statement extends or completes.
	holderBatch = 512
	// holderInFlight is how many statements of each kind a store keeps in
	// flight: two keep the server busy while the previous answer travels
	// back, and leave the other holder connections to the other kind and
	// to releases.
	holderInFlight = 2
	// completeBytes bounds the results one completion statement carries.
	completeBytes = 4 << 20
)

// extendCall is one Store.Extend on its way to the server.
type extendCall struct {
	storekit.Pending
	scope, key   string
	token, lease int64 // lease in microseconds
	until        time.Time
}

// completeCall is one Store.Complete on its way to the server.
type completeCall struct {
	storekit.Pending
	scope, key        string
	token, retention  int64 // retention in microseconds
	result            []byte
	failed, tombstone bool
}

// newCoalescers sets up the store's heartbeat and completion coalescers.
func (s *Store) newCoalescers() {
	s.extends = &storekit.Coalescer[*extendCall]{MaxBatch: holderBatch, InFlight: holderInFlight,
		Exec: func(ctx context.Context, calls []*extendCall) {
			holderStatement(s, ctx, "extend", calls, s.extendStatement)
		},
		Wrap: func(err error) error { return s.wrap("extend", err) }}
	s.completes = &storekit.Coalescer[*completeCall]{MaxBatch: holderBatch, InFlight: holderInFlight,
		Exec: func(ctx context.Context, calls []*completeCall) {
			holderStatement(s, ctx, "complete", calls, s.completeStatement)
		},
		Weight: func(c *completeCall) int { return len(c.result) }, MaxWeight: completeBytes,
		Wrap: func(err error) error { return s.wrap("complete", err) }}
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

// extendStatement extends the leases of calls, one statement for all, and
// sets each call's until or error.
func (s *Store) extendStatement(ctx context.Context, conn *pgxpool.Conn, calls []*extendCall) {
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
	// Sorted by lease, so that concurrent statements lock their rows in the
	// same order.
	sortCalls(calls, func(c *extendCall) lease { return lease{c.scope, c.key, c.token} })
	n := len(calls)
	scopes, keys, tokens, leases := make([]string, n), make([]string, n), make([]int64, n), make([]int64, n)
	for i, c := range calls {
		scopes[i], keys[i], tokens[i], leases[i] = c.scope, c.key, c.token, c.lease
	}
	extended := make(map[lease]time.Time, n)
	rows, err := conn.Query(ctx, s.q.extendBatch, scopes, keys, tokens, leases)
	if err == nil {
		var h lease
		var until time.Time
		_, err = pgx.ForEachRow(rows, []any{&h.scope, &h.key, &h.token, &until}, func() error {
			extended[h] = until
			return nil
		})
	}
	if err != nil {
		storekit.Fail(calls, s.wrap("extend", err))
		return
	}
	// A lease extended twice in one statement (two heartbeats of one
	// holder at once) is updated once; both calls get its new expiry.
	for _, c := range calls {
		if until, ok := extended[lease{c.scope, c.key, c.token}]; ok {
			c.until, c.Err = until, nil
		} else {
			c.Err = fmt.Errorf("idempgx: extend %q: %w", c.key, idem.ErrLeaseLost)
		}
	}
}

// completeStatement completes the records of calls, one statement for
// all, and sets each call's error.
func (s *Store) completeStatement(ctx context.Context, conn *pgxpool.Conn, calls []*completeCall) {
	if len(calls) == 1 {
		c := calls[0]
		tag, err := conn.Exec(ctx, s.q.complete, c.scope, c.key, c.token, c.result, c.failed, c.tombstone, c.retention)
		switch {
		case err != nil:
			c.Err = s.wrap("complete", err)
		case tag.RowsAffected() == 0:
			c.Err = fmt.Errorf("idempgx: complete %q: %w", c.key, idem.ErrLeaseLost)
		}
		return
	}
	sortCalls(calls, func(c *completeCall) lease { return lease{c.scope, c.key, c.token} })
	// The same lease completed twice in one group: the first completes it
	// and the others find it completed, as they would one after the other.
	send := make([]*completeCall, 0, len(calls))
	for i, c := range calls {
		if i > 0 && c.scope == calls[i-1].scope && c.key == calls[i-1].key && c.token == calls[i-1].token {
			c.Err = fmt.Errorf("idempgx: complete %q: %w", c.key, idem.ErrLeaseLost)
			continue
		}
		send = append(send, c)
	}
	n := len(send)
	scopes, keys, tokens, rets := make([]string, n), make([]string, n), make([]int64, n), make([]int64, n)
	results, failed, tombs := make([][]byte, n), make([]bool, n), make([]bool, n)
	for i, c := range send {
		scopes[i], keys[i], tokens[i], rets[i] = c.scope, c.key, c.token, c.retention
		results[i], failed[i], tombs[i] = c.result, c.failed, c.tombstone
	}
	completed := make(map[lease]bool, n)
	rows, err := conn.Query(ctx, s.q.completeBatch, scopes, keys, tokens, results, failed, tombs, rets)
	if err == nil {
		var l lease
		_, err = pgx.ForEachRow(rows, []any{&l.scope, &l.key, &l.token}, func() error {
			completed[l] = true
			return nil
		})
	}
	if err != nil {
		storekit.Fail(send, s.wrap("complete", err))
		return
	}
	for _, c := range send {
		if completed[lease{c.scope, c.key, c.token}] {
			c.Err = nil
		} else {
			c.Err = fmt.Errorf("idempgx: complete %q: %w", c.key, idem.ErrLeaseLost)
		}
	}
}

// lease names one lease: a record and its holder's token.
type lease struct {
	scope, key string
	token      int64
}

// sortCalls sorts a group's calls by their leases, so that concurrent
// statements lock their rows in the same order.
func sortCalls[C any](calls []C, of func(C) lease) {
	slices.SortFunc(calls, func(a, b C) int {
		la, lb := of(a), of(b)
		return cmp.Or(cmp.Compare(la.scope, lb.scope), cmp.Compare(la.key, lb.key), cmp.Compare(la.token, lb.token))
	})
}

// holderStatement runs statement for calls on a lease holder's connection
// (see Store.conn), with the context [storekit.GroupContext] gives them; when no
// connection comes, every call fails.
func holderStatement[C interface {
	storekit.Call
	Context() context.Context
}](s *Store, ctx context.Context, op string, calls []C, statement func(context.Context, *pgxpool.Conn, []C)) {
	ctx, cancel := storekit.GroupContext(ctx, calls)
	defer cancel()
	conn, err := s.conn(ctx, op, true)
	if err != nil {
		storekit.Fail(calls, err)
		return
	}
	defer s.done(conn, true)
	statement(ctx, conn, calls)
}
