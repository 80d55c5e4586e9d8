package idemmysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox/inboxdriver"
)

// Inbox is the inbox table of a store's database: an [inboxdriver.Backend]
// whose handlers get the *sql.Tx that also marks their message processed.
// Get it with [Store.Inbox]; it is safe for concurrent use.
type Inbox struct {
	s *Store
}

var _ inboxdriver.Backend[*sql.Tx] = (*Inbox)(nil)

// Inbox returns the store's inbox (migration 2 creates its tables).
func (s *Store) Inbox() *Inbox { return &Inbox{s: s} }

// inboxColumns is the column list scanInboxRow reads.
const inboxColumns = "id, source, message_id, type, payload, ordering_key, fingerprint, state, attempts, token, " +
	"COALESCE(last_error, ''), COALESCE(dead_reason, ''), received_at, next_attempt_at, processed_at"

func scanInboxRow(row scanner) (inboxdriver.Row, error) {
	var (
		r                               inboxdriver.Row
		source, id, typ, key, fp, state []byte
		lastErr, dead                   string
		received, next, done            dbTime
	)
	if err := row.Scan(&r.ID, &source, &id, &typ, &r.Payload, &key, &fp, &state,
		&r.Attempts, &r.Token, &lastErr, &dead, &received, &next, &done); err != nil {
		return inboxdriver.Row{}, err
	}
	r.Source, r.MessageID, r.Type, r.OrderingKey = string(source), string(id), string(typ), string(key)
	r.LastError, r.DeadReason = lastErr, idem.DeadReason(dead)
	copy(r.Fingerprint[:], fp)
	r.State = inboxdriver.State(state)
	r.ReceivedAt, r.NextAttemptAt, r.ProcessedAt = received.time(), next.time(), done.time()
	if r.State == inboxdriver.StateRunning {
		r.LeaseExpiresAt = r.NextAttemptAt
	}
	if r.Payload == nil {
		r.Payload = []byte{}
	}
	return r, nil
}

// Receive implements [inboxdriver.Backend]: a plain INSERT, and on a
// duplicate id a read of the stored fingerprint.
func (ib *Inbox) Receive(ctx context.Context, msg inboxdriver.Message) (bool, error) {
	return ib.receive(ctx, ib.s.db, msg)
}

// ReceiveTx is Receive in the caller's transaction: the message is in the
// inbox exactly when tx commits. A duplicate id rolls back only its own
// statement, so tx stays usable.
func (ib *Inbox) ReceiveTx(ctx context.Context, tx *sql.Tx, msg inboxdriver.Message) (bool, error) {
	if tx == nil {
		return false, fmt.Errorf("%w: idemmysql: nil transaction", idem.ErrInvalidConfig)
	}
	return ib.receive(ctx, tx, msg)
}

func (ib *Inbox) receive(ctx context.Context, q execer, msg inboxdriver.Message) (bool, error) {
	msg, err := inboxdriver.Prepare(msg)
	if err != nil {
		return false, err
	}
	for range maxRaceRetries {
		_, err := q.ExecContext(ctx, "INSERT INTO idem_inbox (source, message_id, type, payload, ordering_key, fingerprint, received_at, next_attempt_at)"+
			" VALUES (?, ?, ?, ?, ?, ?, "+nowSQL+", "+nowSQL+")", msg.Source, msg.ID, msg.Type, msg.Payload, msg.OrderingKey, msg.Fingerprint[:])
		if err == nil {
			return true, nil
		}
		if errNumber(err) != erDupEntry {
			return false, ib.s.wrap("inbox receive", err)
		}
		var (
			id int64
			fp []byte
		)
		err = q.QueryRowContext(ctx, "SELECT id, fingerprint FROM idem_inbox WHERE source = ? AND message_id = ? LOCK IN SHARE MODE",
			msg.Source, msg.ID).Scan(&id, &fp)
		if errors.Is(err, sql.ErrNoRows) {
			continue // purged since the insert: receive again
		}
		if err != nil {
			return false, ib.s.wrap("inbox receive", err)
		}
		if idem.Fingerprint(fp) != msg.Fingerprint {
			return false, inboxdriver.ReceiveMismatch(msg.Source, msg.ID, id)
		}
		return false, nil
	}
	return false, idem.Retryable(fmt.Errorf("idemmysql: inbox receive %q: row kept changing", msg.ID))
}

// Claim implements [inboxdriver.Backend]: one transaction locks the oldest
// due rows that no other claim holds (FOR UPDATE SKIP LOCKED over the index
// of unfinished rows), gives them one fresh fencing token and a lease, and
// reads them back.
func (ib *Inbox) Claim(ctx context.Context, req inboxdriver.ClaimRequest) ([]inboxdriver.Row, error) {
	if err := inboxdriver.ValidateClaim(req); err != nil {
		return nil, err
	}
	// A row whose selection touches its own dead rows would block the key
	// forever; only unfinished earlier rows (open_key is set for those)
	// hold a key back. The subquery is a plain read: it sees rows other
	// claims hold locked, which SKIP LOCKED would not.
	ordered := ""
	if req.Ordered {
		ordered = " AND (i.ordering_key = '' OR NOT EXISTS (SELECT 1 FROM idem_inbox AS e WHERE e.open_key = i.ordering_key AND e.id < i.id))"
	}
	var out []inboxdriver.Row
	err := ib.s.inTx(ctx, "inbox claim", func(tx *sql.Tx) (bool, error) {
		rows, err := tx.QueryContext(ctx, "SELECT i.id FROM idem_inbox AS i WHERE i.due_at <= "+nowSQL+ordered+
			" ORDER BY i.due_at, i.id LIMIT ? FOR UPDATE SKIP LOCKED", req.Limit)
		if err != nil {
			return false, ib.s.wrap("inbox claim", err)
		}
		var ids []any
		if err := eachRow(rows, func(r *sql.Rows) error {
			var id int64
			err := r.Scan(&id)
			ids = append(ids, id)
			return err
		}); err != nil {
			return false, ib.s.wrap("inbox claim", err)
		}
		if len(ids) == 0 {
			return false, nil
		}
		token, err := newToken(ctx, tx, "idem_inbox_tokens")
		if err != nil {
			return false, ib.s.wrap("inbox claim: next token", err)
		}
		in := placeholders(len(ids))
		args := append([]any{token, micros(req.Lease)}, ids...)
		if _, err := tx.ExecContext(ctx, "UPDATE idem_inbox SET state = 'running', token = ?, next_attempt_at = "+nowSQL+
			" + INTERVAL ? MICROSECOND WHERE id IN ("+in+")", args...); err != nil {
			return false, ib.s.wrap("inbox claim", err)
		}
		byID, err := queryRows(ctx, tx, scanInboxRow, "SELECT "+inboxColumns+" FROM idem_inbox WHERE id IN ("+in+")", ids...)
		if err != nil {
			return false, ib.s.wrap("inbox claim", err)
		}
		// Oldest due first, the order they were selected in.
		pos := make(map[int64]int, len(ids))
		for i, id := range ids {
			pos[id.(int64)] = i
		}
		out = make([]inboxdriver.Row, len(ids))
		for _, r := range byID {
			out[pos[r.ID]] = r
		}
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// placeholders is "?, ?, …" n times.
func placeholders(n int) string { return repeatJoin("?", ", ", n) }

// Complete implements [inboxdriver.Backend]: fn runs first, then the processed
// mark, guarded by the token, in the same transaction. Marking last keeps
// the row unlocked while fn runs, so heartbeats can extend its lease.
func (ib *Inbox) Complete(ctx context.Context, l inboxdriver.Lease, fn func(ctx context.Context, tx *sql.Tx) error) error {
	if fn == nil {
		return fmt.Errorf("%w: idemmysql: nil handler", idem.ErrInvalidConfig)
	}
	op := fmt.Sprintf("inbox complete %d", l.ID)
	return ib.s.inTx(ctx, op, func(tx *sql.Tx) (bool, error) {
		if err := fn(ctx, tx); err != nil {
			return false, err
		}
		// The state changes, so the row counts as affected.
		res, err := tx.ExecContext(ctx, "UPDATE idem_inbox SET state = 'processed', processed_at = "+nowSQL+", next_attempt_at = "+nowSQL+
			" WHERE id = ? AND token = ? AND state = 'running'", l.ID, l.Token)
		if err := ib.s.changedOne(res, err, op, fmt.Sprintf("token %d", l.Token), idem.ErrLeaseLost); err != nil {
			return false, err
		}
		return true, nil
	})
}

// Fail implements [inboxdriver.Backend]; the next attempt is scheduled by the
// database clock.
func (ib *Inbox) Fail(ctx context.Context, req inboxdriver.FailRequest) error {
	if req.Delay < 0 {
		req.Delay = 0
	}
	state := inboxdriver.StatePending
	var dead any // NULL unless the row dies
	if req.Dead {
		state, dead = inboxdriver.StateDead, inboxdriver.CutError(string(req.DeadReason))
	}
	counted := 1
	if req.Uncounted {
		counted = 0
	}
	errText := inboxdriver.CutError(req.Error)
	op := fmt.Sprintf("inbox fail %d", req.ID)
	return ib.s.inTx(ctx, op, func(tx *sql.Tx) (bool, error) {
		// The state changes from running, so the row counts as affected.
		res, err := tx.ExecContext(ctx, "UPDATE idem_inbox SET state = ?, attempts = attempts + ?, last_error = ?, dead_reason = ?,"+
			" next_attempt_at = "+nowSQL+" + INTERVAL ? MICROSECOND WHERE id = ? AND token = ? AND state = 'running'",
			string(state), counted, errText, dead, micros(req.Delay), req.ID, req.Token)
		if err := ib.s.changedOne(res, err, op, fmt.Sprintf("token %d", req.Token), idem.ErrLeaseLost); err != nil {
			return false, err
		}
		if req.Uncounted {
			return true, nil
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO idem_inbox_attempts (inbox_id, attempt, at, error)"+
			" SELECT ?, COALESCE(MAX(attempt), 0) + 1, "+nowSQL+", ? FROM idem_inbox_attempts WHERE inbox_id = ?",
			req.ID, errText, req.ID); err != nil {
			return false, ib.s.wrap(op, err)
		}
		return true, nil
	})
}

// Extend implements [inboxdriver.Backend]. MySQL has no RETURNING: the
// leases still held are read back by token after the UPDATE.
func (ib *Inbox) Extend(ctx context.Context, ls []inboxdriver.Lease, lease time.Duration) ([]int64, error) {
	if lease <= 0 {
		return nil, fmt.Errorf("%w: idemmysql: lease must be positive, got %v", idem.ErrInvalidConfig, lease)
	}
	if len(ls) == 0 {
		return nil, nil
	}
	where, args := leaseFilter("running", ls)
	if _, err := ib.s.db.ExecContext(ctx, "UPDATE idem_inbox SET next_attempt_at = "+nowSQL+" + INTERVAL ? MICROSECOND WHERE "+where,
		append([]any{micros(lease)}, args...)...); err != nil {
		return nil, ib.s.wrap("inbox extend", err)
	}
	rows, err := ib.s.db.QueryContext(ctx, "SELECT id FROM idem_inbox WHERE "+where, args...)
	if err != nil {
		return nil, ib.s.wrap("inbox extend", err)
	}
	var kept []int64
	if err := eachRow(rows, func(r *sql.Rows) error {
		var id int64
		err := r.Scan(&id)
		kept = append(kept, id)
		return err
	}); err != nil {
		return nil, ib.s.wrap("inbox extend", err)
	}
	return kept, nil
}

// Release implements [inboxdriver.Backend].
func (ib *Inbox) Release(ctx context.Context, ls []inboxdriver.Lease) (int64, error) {
	return ib.s.releaseLeases(ctx, "inbox release", "idem_inbox", "running", ls)
}

// PurgeProcessed implements [inboxdriver.Backend]: batches of at most limit
// rows, each locked with SKIP LOCKED and deleted in a short transaction of
// its own (their history goes with them, ON DELETE CASCADE); then the spent
// rows of the inbox's token counter.
func (ib *Inbox) PurgeProcessed(ctx context.Context, olderThan time.Duration, limit int) (int64, error) {
	if olderThan < 0 || limit < 0 || limit > inboxdriver.MaxBatch {
		return 0, fmt.Errorf("%w: idemmysql: purge: olderThan must not be negative and limit must be 0..%d", idem.ErrInvalidConfig, inboxdriver.MaxBatch)
	}
	if limit == 0 {
		limit = ib.s.cfg.PurgeBatch
	}
	return ib.s.purgeFinished(ctx, "inbox purge", "idem_inbox", "processed", "processed_at", "idem_inbox_tokens", olderThan, limit)
}

// Stats implements [inboxdriver.Admin].
func (ib *Inbox) Stats(ctx context.Context) ([]inboxdriver.StateCount, error) {
	return countStates(ctx, ib.s, "inbox stats", "SELECT state, COUNT(*), COALESCE(TIMESTAMPDIFF(MICROSECOND, MIN(received_at), "+nowSQL+"), 0)"+
		" FROM idem_inbox GROUP BY state", inboxdriver.States())
}

// List implements [inboxdriver.Admin].
func (ib *Inbox) List(ctx context.Context, req inboxdriver.ListRequest) ([]inboxdriver.Row, error) {
	limit, err := inboxdriver.ListLimit(req)
	if err != nil {
		return nil, err
	}
	return listRows(ctx, ib.s, "inbox list", scanInboxRow, "SELECT "+inboxColumns+" FROM idem_inbox WHERE state = ? AND id > ? ORDER BY id LIMIT ?",
		string(req.State), req.AfterID, limit)
}

// Get implements [inboxdriver.Admin].
func (ib *Inbox) Get(ctx context.Context, id int64) (inboxdriver.Row, []inboxdriver.Attempt, error) {
	r, err := scanInboxRow(ib.s.db.QueryRowContext(ctx, "SELECT "+inboxColumns+" FROM idem_inbox WHERE id = ?", id))
	if errors.Is(err, sql.ErrNoRows) {
		return inboxdriver.Row{}, nil, fmt.Errorf("idemmysql: inbox row %d: %w", id, idem.ErrNotFound)
	}
	if err != nil {
		return inboxdriver.Row{}, nil, ib.s.wrap("inbox get", err)
	}
	rows, err := ib.s.db.QueryContext(ctx, "SELECT attempt, at, error FROM idem_inbox_attempts WHERE inbox_id = ? ORDER BY attempt", id)
	if err != nil {
		return inboxdriver.Row{}, nil, ib.s.wrap("inbox get", err)
	}
	var hist []inboxdriver.Attempt
	err = eachRow(rows, func(r *sql.Rows) error {
		var (
			a  inboxdriver.Attempt
			at dbTime
		)
		err := r.Scan(&a.Number, &at, &a.Error)
		a.At = at.time()
		hist = append(hist, a)
		return err
	})
	if err != nil {
		return inboxdriver.Row{}, nil, ib.s.wrap("inbox get", err)
	}
	return r, hist, nil
}

// Redrive implements [inboxdriver.Admin].
func (ib *Inbox) Redrive(ctx context.Context, sel inboxdriver.Select) (int64, error) {
	return ib.deadBatches(ctx, "inbox redrive", sel, func(tx *sql.Tx, ids []any) (sql.Result, error) {
		return tx.ExecContext(ctx, "UPDATE idem_inbox SET state = 'pending', attempts = 0, dead_reason = NULL, next_attempt_at = "+nowSQL+
			" WHERE id IN ("+placeholders(len(ids))+")", ids...)
	})
}

// Discard implements [inboxdriver.Admin].
func (ib *Inbox) Discard(ctx context.Context, sel inboxdriver.Select) (int64, error) {
	return ib.deadBatches(ctx, "inbox discard", sel, func(tx *sql.Tx, ids []any) (sql.Result, error) {
		return tx.ExecContext(ctx, "DELETE FROM idem_inbox WHERE id IN ("+placeholders(len(ids))+")", ids...)
	})
}

func (ib *Inbox) deadBatches(ctx context.Context, op string, sel inboxdriver.Select, change func(tx *sql.Tx, ids []any) (sql.Result, error)) (int64, error) {
	if err := inboxdriver.ValidateSelect(sel); err != nil {
		return 0, err
	}
	return ib.s.deadBatches(ctx, op, "idem_inbox", sel, ib.s.cfg.PurgeBatch, change)
}
