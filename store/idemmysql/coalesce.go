package idemmysql

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/storekit"
)

// Lease holders' writes share statements, as in idempgx. A process that
// holds many leases (idem proxy, a consumer with a large batch in flight,
// the HTTP middleware under load) heartbeats them all every Lease/3, and
// the leases it took in one burst fall due together, and often complete
// together. Sent one by one, each heartbeat (an UPDATE, then a SELECT to
// read the new expiry back: MySQL has no UPDATE … RETURNING) and each
// completion paid its own round trips and its own commit on a pool
// connection, and a burst of hundreds queued behind each other on the
// pool. Concurrent Extends, and concurrent Completes, are instead sent as
// groups (see [storekit.Coalescer]); a lone call is still the statements
// it always was, sent at once from its caller's goroutine.
//
// A group of heartbeats is one UPDATE joined to its leases (a derived
// table of UNION ALL rows) and one SELECT that reads the new expiries back
// through the same join; like a lone heartbeat, it needs no transaction.
// A group of completions is one READ COMMITTED transaction: its records
// locked with SELECT … FOR UPDATE in key order (so that groups, which all
// lock that way, cannot deadlock each other), the holders decided in Go,
// then one joined UPDATE for the leases still held, and a commit.
const (
	// holderBatch bounds the leases one group extends or completes: at most
	// 7 placeholders each, far under MySQL's 65,535.
	holderBatch = 512
	// holderInFlight is how many groups of each kind a store keeps in
	// flight: two keep the server busy while the previous answer travels
	// back, and leave the other holder connections to the other kind and
	// to releases.
	holderInFlight = 2
	// minCompleteBytes and maxCompleteBytes bound the result bytes (plus
	// scopes and keys) that one group of completions carries: as much as
	// one lone completion may (MaxResultBytes, which must fit in the
	// server's max_allowed_packet), but at least 1 MiB, so that a small
	// MaxResultBytes still lets small results share, and at most 4 MiB:
	// escaped (at worst twice as long), the statement stays within half of
	// the smallest default max_allowed_packet of the supported servers (16
	// MiB on MariaDB), and beyond that a group saves bytes' worth of time,
	// not round trips. A completion heavier than the bound is sent alone,
	// with a lone completion's statement.
	minCompleteBytes = 1 << 20
	maxCompleteBytes = 4 << 20
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

func (c *extendCall) id() lease   { return lease{c.scope, c.key, c.token} }
func (c *completeCall) id() lease { return lease{c.scope, c.key, c.token} }

func (c *extendCall) outcome() *error   { return &c.Err }
func (c *completeCall) outcome() *error { return &c.Err }

// lease names one lease: a record and its holder's token.
type lease struct {
	scope, key string
	token      int64
}

// compareLeases orders leases by record, the order of the primary key (the
// columns are VARBINARY, compared byte by byte, as Go compares strings),
// then by token.
func compareLeases(a, b lease) int {
	return cmp.Or(cmp.Compare(a.scope, b.scope), cmp.Compare(a.key, b.key), cmp.Compare(a.token, b.token))
}

// newCoalescers sets up the store's heartbeat and completion coalescers.
func (s *Store) newCoalescers() {
	s.extends = &storekit.Coalescer[*extendCall]{MaxBatch: holderBatch, InFlight: holderInFlight,
		Exec: func(ctx context.Context, calls []*extendCall) {
			holderGroup(ctx, calls, func(err error) error { return s.wrap("extend", err) }, s.extendOne, s.extendGroup)
		},
		Wrap: func(err error) error { return s.wrap("extend", err) }}
	s.completes = &storekit.Coalescer[*completeCall]{MaxBatch: holderBatch, InFlight: holderInFlight,
		Exec: func(ctx context.Context, calls []*completeCall) {
			holderGroup(ctx, calls, func(err error) error { return s.wrap("complete", err) }, s.completeOne, s.completeGroup)
		},
		Weight:    func(c *completeCall) int { return len(c.result) + len(c.scope) + len(c.key) },
		MaxWeight: min(max(s.cfg.MaxResultBytes, minCompleteBytes), maxCompleteBytes),
		Wrap:      func(err error) error { return s.wrap("complete", err) }}
}

// holderGroup runs the statements of calls with the context
// [storekit.GroupContext] gives them (it ends once every caller's context
// has ended): one's own statements for a single call, the group's for
// more. Like a lone call's, they go straight to the pool, never through
// the gate: the HolderConns connections it keeps free are theirs. A call
// whose statements failed once every caller's context had ended gets its
// own context's error (wrapped), not the group's (unless its commit's
// outcome is unknown); it had mostly stopped waiting already.
//
// The driver gives up on a statement by closing its connection; the
// server may still finish the statement (a heartbeat waiting on a row
// lock, once the lock is granted), but not a transaction that was not
// committed: a group of completions is rolled back.
func holderGroup[C interface {
	storekit.Call
	Context() context.Context
	outcome() *error
}](ctx context.Context, calls []C, wrap func(error) error, one func(context.Context, C), group func(context.Context, []C)) {
	gctx, cancel := storekit.GroupContext(ctx, calls)
	defer cancel()
	if len(calls) == 1 {
		one(gctx, calls[0])
	} else {
		group(gctx, calls)
	}
	if gctx.Err() == nil {
		return
	}
	for _, c := range calls {
		if err := c.outcome(); *err != nil && !errors.Is(*err, idem.ErrLeaseLost) && !errors.Is(*err, idem.ErrCommitUnknown) &&
			c.Context().Err() != nil {
			*err = wrap(context.Cause(c.Context()))
		}
	}
}

// Extend implements [idem.Store]. A lone heartbeat is an UPDATE that checks
// the token, then a SELECT that reads the new expiry back by the token
// (MySQL has no RETURNING; whether the UPDATE counted the row as changed,
// which depends on clientFoundRows, does not matter). Concurrent Extends
// are sent as groups of up to 512: one UPDATE … JOIN over their leases,
// then one SELECT of the expiries, each caller getting its own.
func (s *Store) Extend(ctx context.Context, scope, key string, token int64, lease time.Duration) (time.Time, error) {
	if err := idem.Validate(scope, key); err != nil {
		return time.Time{}, err
	}
	if lease <= 0 {
		return time.Time{}, fmt.Errorf("%w: lease must be positive, got %v", idem.ErrInvalidConfig, lease)
	}
	c := &extendCall{scope: scope, key: key, token: token, lease: micros(lease)}
	if err := s.extends.Do(ctx, c); err != nil {
		// c may still be in flight: its group writes c.until.
		return time.Time{}, err
	}
	return c.until, nil
}

// extendOne is a lone heartbeat's statements.
func (s *Store) extendOne(ctx context.Context, c *extendCall) {
	const held = " WHERE scope = ? AND `key` = ? AND token = ? AND state = 'in_progress'"
	if _, err := s.db.ExecContext(ctx, "UPDATE idem_records SET lease_expires_at = "+nowSQL+" + INTERVAL ? MICROSECOND,"+
		" expires_at = "+nowSQL+" + INTERVAL ? MICROSECOND"+held, c.lease, c.lease, c.scope, c.key, c.token); err != nil {
		c.Err = s.wrap("extend", err)
		return
	}
	var until dbTime
	err := s.db.QueryRowContext(ctx, "SELECT lease_expires_at FROM idem_records"+held, c.scope, c.key, c.token).Scan(&until)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		c.Err = fmt.Errorf("idemmysql: extend %q: %w", c.key, idem.ErrLeaseLost)
	case err != nil:
		c.Err = s.wrap("extend", err)
	default:
		c.until = until.time()
	}
}

// The statements of the groups: a head, a row per lease (or record) with
// sep between them, and a tail.
type groupStatement struct {
	head, first, later, sep, tail string
}

// sql returns the statement for n rows.
func (g groupStatement) sql(n int) string {
	var b strings.Builder
	b.Grow(len(g.head) + len(g.first) + (n-1)*(len(g.sep)+len(g.later)) + len(g.tail))
	b.WriteString(g.head)
	b.WriteString(g.first)
	for range n - 1 {
		b.WriteString(g.sep)
		b.WriteString(g.later)
	}
	b.WriteString(g.tail)
	return b.String()
}

var (
	// extendGroupSQL extends the held leases among its rows (scope, key,
	// token, lease in microseconds). The join reads the derived table
	// first and each record by its primary key (STRAIGHT_JOIN, FORCE
	// INDEX), so that it locks only the group's rows, in the derived
	// table's order: key order. Left to itself, MariaDB scans the whole
	// table of a small idem_records once it has seen the derived table's
	// rows, and waits on (at REPEATABLE READ, locks) every row of it.
	extendGroupSQL = groupStatement{
		head:  "UPDATE (",
		first: "SELECT CAST(? AS BINARY) AS scope, CAST(? AS BINARY) AS k, ? AS token, ? AS lease_us",
		later: "SELECT CAST(? AS BINARY), CAST(? AS BINARY), ?, ?", sep: " UNION ALL ",
		tail: ") AS v STRAIGHT_JOIN idem_records AS r FORCE INDEX (PRIMARY) ON r.scope = v.scope AND r.`key` = v.k AND r.token = v.token" +
			" SET r.lease_expires_at = " + nowSQL + " + INTERVAL v.lease_us MICROSECOND," +
			" r.expires_at = " + nowSQL + " + INTERVAL v.lease_us MICROSECOND WHERE r.state = 'in_progress'",
	}
	// extendReadSQL reads the expiries of the held leases among its rows
	// (scope, key, token).
	extendReadSQL = groupStatement{
		head:  "SELECT r.scope, r.`key`, r.token, r.lease_expires_at FROM (",
		first: "SELECT CAST(? AS BINARY) AS scope, CAST(? AS BINARY) AS k, ? AS token",
		later: "SELECT CAST(? AS BINARY), CAST(? AS BINARY), ?", sep: " UNION ALL ",
		tail: ") AS v STRAIGHT_JOIN idem_records AS r FORCE INDEX (PRIMARY) ON r.scope = v.scope AND r.`key` = v.k AND r.token = v.token" +
			" WHERE r.state = 'in_progress'",
	}
	// completeLockSQL locks the in-progress records among its rows (scope,
	// key), in key order (a range read of the primary key), and reads their
	// tokens.
	completeLockSQL = groupStatement{
		head:  "SELECT scope, `key`, token FROM idem_records FORCE INDEX (PRIMARY) WHERE (scope, `key`) IN (",
		first: "(?, ?)", later: "(?, ?)", sep: ", ",
		tail: ") AND state = 'in_progress' ORDER BY scope, `key` FOR UPDATE",
	}
	// completeGroupSQL completes the records of its rows (scope, key,
	// token, result, failed, tombstone, retention in microseconds). The
	// byte strings are cast to binary: a prepared statement's parameter is
	// text of the connection's character set, and a result that is not
	// valid text in it would not go into the derived table's column.
	completeGroupSQL = groupStatement{
		head: "UPDATE (",
		first: "SELECT CAST(? AS BINARY) AS scope, CAST(? AS BINARY) AS k, ? AS token, CAST(? AS BINARY) AS result," +
			" ? AS failed, ? AS tombstone, ? AS retention_us",
		later: "SELECT CAST(? AS BINARY), CAST(? AS BINARY), ?, CAST(? AS BINARY), ?, ?, ?", sep: " UNION ALL ",
		tail: ") AS v STRAIGHT_JOIN idem_records AS r FORCE INDEX (PRIMARY) ON r.scope = v.scope AND r.`key` = v.k AND r.token = v.token" +
			" SET r.state = 'completed', r.result = v.result, r.failed = v.failed, r.tombstone = v.tombstone," +
			" r.lease_expires_at = NULL, r.completed_at = " + nowSQL + "," +
			" r.expires_at = " + nowSQL + " + INTERVAL v.retention_us MICROSECOND WHERE r.state = 'in_progress'",
	}
)

// extendGroup extends the leases of calls with one UPDATE, reads their new
// expiries back with one SELECT, and sets each call's until or error.
func (s *Store) extendGroup(ctx context.Context, calls []*extendCall) {
	// One holder's two heartbeats of one lease in a group: the later one's
	// lease is sent, as if they ran one after the other, and both get the
	// record's new expiry.
	last := make(map[lease]*extendCall, len(calls))
	for _, c := range calls {
		last[c.id()] = c
	}
	rows := make([]*extendCall, 0, len(last))
	for _, c := range last {
		rows = append(rows, c)
	}
	// In key order, the order in which the UPDATE locks the rows (it reads
	// the derived table first), as every group does.
	slices.SortFunc(rows, func(a, b *extendCall) int { return compareLeases(a.id(), b.id()) })
	update, read := make([]any, 0, 4*len(rows)), make([]any, 0, 3*len(rows))
	for _, c := range rows {
		update = append(update, []byte(c.scope), []byte(c.key), c.token, c.lease)
		read = append(read, []byte(c.scope), []byte(c.key), c.token)
	}
	extended := make(map[lease]time.Time, len(rows))
	err := s.retryGroup(ctx, "extend", func() error {
		// Only the UPDATE takes locks; a deadlock rolled it back whole.
		_, err := s.db.ExecContext(ctx, extendGroupSQL.sql(len(rows)), update...)
		return err
	})
	if err == nil {
		err = s.readExtended(ctx, read, len(rows), extended)
	}
	if err != nil {
		storekit.Fail(calls, s.wrap("extend", err))
		return
	}
	for _, c := range calls {
		if until, ok := extended[c.id()]; ok {
			c.until, c.Err = until, nil
		} else {
			c.Err = fmt.Errorf("idemmysql: extend %q: %w", c.key, idem.ErrLeaseLost)
		}
	}
}

// readExtended reads the expiries of the n leases of args that are still
// held into extended.
func (s *Store) readExtended(ctx context.Context, args []any, n int, extended map[lease]time.Time) error {
	rows, err := s.db.QueryContext(ctx, extendReadSQL.sql(n), args...)
	if err != nil {
		return err
	}
	return eachRow(rows, func(r *sql.Rows) error {
		var (
			scope, key []byte
			token      int64
			until      dbTime
		)
		if err := r.Scan(&scope, &key, &token, &until); err != nil {
			return err
		}
		extended[lease{string(scope), string(key), token}] = until.time()
		return nil
	})
}

// retryGroup runs attempt, a group's statement or transaction, again after
// a deadlock (the server rolled it back whole, so it changed nothing), up
// to maxRaceRetries times while ctx lasts. Groups lock their rows in key
// order, so a deadlock takes some other writer's locks in another order.
// A lock wait timeout is not retried: it took innodb_lock_wait_timeout
// (50 s by default), longer than any heartbeat can wait, and every call of
// the group gets it, marked retryable, as a lone call would.
func (s *Store) retryGroup(ctx context.Context, op string, attempt func() error) error {
	ran := false
	tries := 0
	return retryDeadlocks(ctx, &ran, func() error {
		if tries++; tries > 1 {
			s.cfg.Logger.DebugContext(ctx, "idemmysql: a group of lease holders' writes deadlocked, retrying", "op", op, "attempt", tries)
		}
		return attempt()
	})
}

// Complete implements [idem.Store]. A result over MaxResultBytes is not
// stored: the record becomes a tombstone (and a warning is logged). A lone
// completion is one UPDATE that checks the token. Concurrent Completes are
// sent as groups of up to 512 (and up to 1–4 MiB of results, see
// maxCompleteBytes) in one transaction: the records locked in key order,
// each lease checked, one UPDATE … JOIN for the leases still held, one
// commit. Of two completions of one lease in a group the first wins and
// the other gets ErrLeaseLost, as one after the other.
func (s *Store) Complete(ctx context.Context, req idem.CompleteRequest) error {
	if err := idem.ValidateComplete(req); err != nil {
		return err
	}
	result, tombstone := storekit.StoredResult(ctx, s.cfg.Logger, "idemmysql", req, s.cfg.MaxResultBytes)
	return s.completes.Do(ctx, &completeCall{scope: req.Scope, key: req.Key, token: req.Token, retention: micros(req.Retention),
		result: result, failed: req.Failed, tombstone: tombstone})
}

// completeOne is a lone completion's statement.
func (s *Store) completeOne(ctx context.Context, c *completeCall) {
	// The state changes from in_progress, so the row counts as affected
	// whatever the DSN's clientFoundRows says.
	res, err := s.db.ExecContext(ctx, "UPDATE idem_records SET state = 'completed', result = ?, failed = ?, tombstone = ?,"+
		" lease_expires_at = NULL, completed_at = "+nowSQL+", expires_at = "+nowSQL+" + INTERVAL ? MICROSECOND"+
		" WHERE scope = ? AND `key` = ? AND token = ? AND state = 'in_progress'",
		c.result, c.failed, c.tombstone, c.retention, c.scope, c.key, c.token)
	c.Err = s.changedOne(res, err, "complete", c.key, idem.ErrLeaseLost)
}

// completeGroup completes the records of calls in one transaction and sets
// each call's error. Any error fails every call: nothing of the group was
// committed.
func (s *Store) completeGroup(ctx context.Context, calls []*completeCall) {
	var held []*completeCall // the calls that complete their record
	err := s.retryGroup(ctx, "complete", func() error {
		held = nil
		return s.inTx(ctx, "complete", func(tx *sql.Tx) (bool, error) {
			var err error
			held, err = s.completeTx(ctx, tx, calls)
			if err != nil {
				return false, err
			}
			return len(held) > 0, nil
		})
	})
	if err != nil {
		storekit.Fail(calls, err)
		return
	}
	done := make(map[*completeCall]bool, len(held))
	for _, c := range held {
		done[c] = true
	}
	for _, c := range calls {
		if done[c] {
			c.Err = nil
		} else {
			c.Err = fmt.Errorf("idemmysql: complete %q: %w", c.key, idem.ErrLeaseLost)
		}
	}
}

// completeTx locks the records of calls, decides which calls hold their
// lease and completes those, in tx; it returns them.
func (s *Store) completeTx(ctx context.Context, tx *sql.Tx, calls []*completeCall) ([]*completeCall, error) {
	type record struct{ scope, key string }
	records := make([]record, 0, len(calls))
	seen := make(map[record]bool, len(calls))
	for _, c := range calls {
		if r := (record{c.scope, c.key}); !seen[r] {
			seen[r] = true
			records = append(records, r)
		}
	}
	slices.SortFunc(records, func(a, b record) int { return cmp.Or(cmp.Compare(a.scope, b.scope), cmp.Compare(a.key, b.key)) })
	args := make([]any, 0, 2*len(records))
	for _, r := range records {
		args = append(args, []byte(r.scope), []byte(r.key))
	}
	rows, err := tx.QueryContext(ctx, completeLockSQL.sql(len(records)), args...)
	if err != nil {
		return nil, s.wrap("complete", err)
	}
	holders := make(map[record]int64, len(records)) // the token of each in-progress record
	err = eachRow(rows, func(r *sql.Rows) error {
		var (
			scope, key []byte
			token      int64
		)
		if err := r.Scan(&scope, &key, &token); err != nil {
			return err
		}
		holders[record{string(scope), string(key)}] = token
		return nil
	})
	if err != nil {
		return nil, s.wrap("complete", err)
	}
	// In the order the calls came: the first completion of a lease takes
	// it, a later one finds it completed.
	var held []*completeCall
	for _, c := range calls {
		r := record{c.scope, c.key}
		if token, ok := holders[r]; ok && token == c.token {
			held = append(held, c)
			delete(holders, r)
		}
	}
	if len(held) == 0 {
		return nil, nil
	}
	sorted := slices.Clone(held)
	slices.SortFunc(sorted, func(a, b *completeCall) int { return compareLeases(a.id(), b.id()) })
	args = make([]any, 0, 7*len(sorted))
	for _, c := range sorted {
		args = append(args, []byte(c.scope), []byte(c.key), c.token, c.result, c.failed, c.tombstone, c.retention)
	}
	res, err := tx.ExecContext(ctx, completeGroupSQL.sql(len(sorted)), args...)
	if err != nil {
		return nil, s.wrap("complete", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return nil, s.wrap("complete", err)
	}
	if n != int64(len(sorted)) {
		// The rows are locked and were read in this transaction: this cannot
		// happen, and nothing is committed if it does.
		return nil, fmt.Errorf("idemmysql: complete: a group of %d completions of locked records changed %d rows; rolled back", len(sorted), n)
	}
	return held, nil
}
