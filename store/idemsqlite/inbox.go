package idemsqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox/inboxdriver"
)

// Inbox is the inbox table of a store's database: an [inboxdriver.Backend] whose
// handlers get the *sql.Tx that also marks their message processed. Get it
// with [Store.Inbox]. Claims, completions and failures go through the
// store's write queue, so they run one at a time within a process and SQLite
// arbitrates between processes (BEGIN IMMEDIATE).
//
// A handler runs inside its completing transaction, which holds SQLite's
// write lock: handlers on one database file run one at a time, whatever the
// number of workers, and heartbeats wait for them. Keep handlers short and
// the worker's Lease well above a handler's duration; use PostgreSQL when
// handlers must run in parallel.
type Inbox struct {
	s *Store
	t stateTable
}

var _ inboxdriver.Backend[*sql.Tx] = (*Inbox)(nil)

// Inbox returns the store's inbox (migration 2 creates its tables).
func (s *Store) Inbox() *Inbox { return &Inbox{s: s, t: stateTable{s: s, name: "idem_inbox"}} }

const inboxColumns = `id, source, message_id, type, payload, ordering_key, fingerprint, state, attempts, token,
	coalesce(last_error, ''), coalesce(dead_reason, ''), received_at, next_attempt_at, processed_at`

func scanInboxRow(row scanner) (inboxdriver.Row, error) {
	var (
		r                   inboxdriver.Row
		fp                  []byte
		state               string
		recv, next          int64
		done                sql.NullInt64
		payload, lastErrRaw []byte
	)
	if err := row.Scan(&r.ID, &r.Source, &r.MessageID, &r.Type, &payload, &r.OrderingKey, &fp, &state,
		&r.Attempts, &r.Token, &lastErrRaw, &r.DeadReason, &recv, &next, &done); err != nil {
		return inboxdriver.Row{}, err
	}
	r.Payload = append([]byte{}, payload...)
	r.LastError = string(lastErrRaw)
	copy(r.Fingerprint[:], fp)
	r.State = inboxdriver.State(state)
	r.ReceivedAt, r.NextAttemptAt = time.UnixMicro(recv), time.UnixMicro(next)
	if r.State == inboxdriver.StateRunning {
		r.LeaseExpiresAt = r.NextAttemptAt
	}
	r.ProcessedAt = fromMicros(done)
	return r, nil
}

type execQuerier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Receive implements [inboxdriver.Backend]: one INSERT … ON CONFLICT DO NOTHING.
func (ib *Inbox) Receive(ctx context.Context, msg inboxdriver.Message) (bool, error) {
	msg, err := inboxdriver.Prepare(msg)
	if err != nil {
		return false, err
	}
	var isNew bool
	err = ib.s.inTx(ctx, "inbox receive", func(tx *sql.Tx, now int64) error {
		var err error
		isNew, err = ib.receive(ctx, tx, msg, now)
		return err
	})
	return isNew, err
}

// ReceiveTx is Receive in the caller's transaction: the message is in the
// inbox exactly when tx commits. Open the database like [OpenDB] does
// (BEGIN IMMEDIATE), or a transaction that read first may fail with a
// retryable busy error.
func (ib *Inbox) ReceiveTx(ctx context.Context, tx *sql.Tx, msg inboxdriver.Message) (bool, error) {
	if tx == nil {
		return false, fmt.Errorf("%w: idemsqlite: nil transaction", idem.ErrInvalidConfig)
	}
	msg, err := inboxdriver.Prepare(msg)
	if err != nil {
		return false, err
	}
	return ib.receive(ctx, tx, msg, micros(ib.s.now()))
}

func (ib *Inbox) receive(ctx context.Context, q execQuerier, msg inboxdriver.Message, now int64) (bool, error) {
	var id int64
	err := q.QueryRowContext(ctx, `INSERT INTO idem_inbox (source, message_id, type, payload, ordering_key, fingerprint, received_at, next_attempt_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (source, message_id) DO NOTHING RETURNING id`,
		msg.Source, msg.ID, msg.Type, msg.Payload, msg.OrderingKey, msg.Fingerprint[:], now, now).Scan(&id)
	if err == nil {
		return true, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return false, ib.wrap("inbox receive", err)
	}
	// The insert and this read are in one transaction, so the row is there.
	var fp []byte
	if err := q.QueryRowContext(ctx, `SELECT id, fingerprint FROM idem_inbox WHERE source = ? AND message_id = ?`,
		msg.Source, msg.ID).Scan(&id, &fp); err != nil {
		return false, ib.wrap("inbox receive", err)
	}
	if idem.Fingerprint(fp) != msg.Fingerprint {
		return false, inboxdriver.ReceiveMismatch(msg.Source, msg.ID, id)
	}
	return false, nil
}

func (ib *Inbox) wrap(op string, err error) error { return ib.t.wrap(op, err) }

// Claim implements [inboxdriver.Backend]: it selects and leases due rows in one
// BEGIN IMMEDIATE transaction, so no other writer can claim them meanwhile.
func (ib *Inbox) Claim(ctx context.Context, req inboxdriver.ClaimRequest) ([]inboxdriver.Row, error) {
	if err := inboxdriver.ValidateClaim(req); err != nil {
		return nil, err
	}
	var out []inboxdriver.Row
	err := ib.s.inTx(ctx, "inbox claim", func(tx *sql.Tx, now int64) error {
		out = out[:0]
		query := `SELECT id FROM idem_inbox AS i WHERE state IN ('pending', 'running') AND next_attempt_at <= ?`
		if req.Ordered {
			query += ` AND (i.ordering_key = '' OR NOT EXISTS (SELECT 1 FROM idem_inbox AS e
	WHERE e.ordering_key = i.ordering_key AND e.id < i.id AND e.state IN ('pending', 'running')))`
		}
		query += ` ORDER BY next_attempt_at, id LIMIT ?`
		rows, err := tx.QueryContext(ctx, query, now, req.Limit)
		if err != nil {
			return ib.wrap("inbox claim", err)
		}
		var ids []int64
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return ib.wrap("inbox claim", err)
			}
			ids = append(ids, id)
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			return ib.wrap("inbox claim", err)
		}
		if len(ids) == 0 {
			return nil
		}
		var top int64
		if err := tx.QueryRowContext(ctx, `UPDATE idem_inbox_token_counter SET value = value + ? WHERE id = 1 RETURNING value`,
			len(ids)).Scan(&top); err != nil {
			return ib.wrap("inbox claim: token", err)
		}
		until := now + durMicros(req.Lease)
		for i, id := range ids {
			r, err := scanInboxRow(tx.QueryRowContext(ctx, `UPDATE idem_inbox SET state = 'running', token = ?, next_attempt_at = ?
WHERE id = ? RETURNING `+inboxColumns, top-int64(len(ids)-1-i), until, id))
			if err != nil {
				return ib.wrap("inbox claim", err)
			}
			out = append(out, r)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// durMicros converts a duration to microseconds, rounding up.
func durMicros(d time.Duration) int64 {
	us := d / time.Microsecond
	if d%time.Microsecond != 0 {
		us++
	}
	return int64(us)
}

// Complete implements [inboxdriver.Backend]: fn runs, then the processed mark,
// guarded by the token, in the same transaction.
func (ib *Inbox) Complete(ctx context.Context, l inboxdriver.Lease, fn func(ctx context.Context, tx *sql.Tx) error) error {
	if fn == nil {
		return fmt.Errorf("%w: idemsqlite: nil handler", idem.ErrInvalidConfig)
	}
	op := fmt.Sprintf("inbox complete %d", l.ID)
	return ib.s.inTx(ctx, op, func(tx *sql.Tx, now int64) error {
		if err := fn(ctx, tx); err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, `UPDATE idem_inbox SET state = 'processed', processed_at = ?, next_attempt_at = ?
WHERE id = ? AND token = ? AND state = 'running'`, now, now, l.ID, l.Token)
		return ib.leaseHeld(op, l, res, err)
	})
}

func (ib *Inbox) leaseHeld(op string, l inboxdriver.Lease, res sql.Result, err error) error {
	if err != nil {
		return ib.wrap(op, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return ib.wrap(op, err)
	}
	if n == 0 {
		return fmt.Errorf("idemsqlite: %s (token %d): %w", op, l.Token, idem.ErrLeaseLost)
	}
	return nil
}

// Fail implements [inboxdriver.Backend].
func (ib *Inbox) Fail(ctx context.Context, req inboxdriver.FailRequest) error {
	if req.Delay < 0 {
		req.Delay = 0
	}
	op := fmt.Sprintf("inbox fail %d", req.ID)
	msg := inboxdriver.CutError(req.Error)
	return ib.s.inTx(ctx, op, func(tx *sql.Tx, now int64) error {
		state, reason, add := "pending", sql.NullString{}, 1
		if req.Dead {
			state, reason = "dead", sql.NullString{String: inboxdriver.CutError(string(req.DeadReason)), Valid: true}
		}
		if req.Uncounted {
			add = 0
		}
		res, err := tx.ExecContext(ctx, `UPDATE idem_inbox SET state = ?, attempts = attempts + ?, last_error = ?, dead_reason = ?,
	next_attempt_at = ? WHERE id = ? AND token = ? AND state = 'running'`,
			state, add, msg, reason, now+durMicros(req.Delay), req.ID, req.Token)
		if err := ib.leaseHeld(op, req.Lease, res, err); err != nil || req.Uncounted {
			return err
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO idem_inbox_attempts (inbox_id, attempt, at, error)
SELECT ?, coalesce(max(attempt), 0) + 1, ?, ? FROM idem_inbox_attempts WHERE inbox_id = ?`, req.ID, now, msg, req.ID)
		if err != nil {
			return ib.wrap(op, err)
		}
		return nil
	})
}

// Extend implements [inboxdriver.Backend].
func (ib *Inbox) Extend(ctx context.Context, ls []inboxdriver.Lease, lease time.Duration) ([]int64, error) {
	if lease <= 0 {
		return nil, fmt.Errorf("%w: idemsqlite: lease must be positive, got %v", idem.ErrInvalidConfig, lease)
	}
	if len(ls) == 0 {
		return nil, nil
	}
	return ib.t.held(ctx, "inbox extend", ls, `UPDATE idem_inbox SET next_attempt_at = ? WHERE id = ? AND token = ? AND state = 'running'`,
		func(_ int, now int64) []any { return []any{now + durMicros(lease)} })
}

// Release implements [inboxdriver.Backend].
func (ib *Inbox) Release(ctx context.Context, ls []inboxdriver.Lease) (int64, error) {
	kept, err := ib.t.held(ctx, "inbox release", ls, `UPDATE idem_inbox SET state = 'pending', next_attempt_at = ?
WHERE id = ? AND token = ? AND state = 'running'`, func(_ int, now int64) []any { return []any{now} })
	return int64(len(kept)), err
}

// PurgeProcessed implements [inboxdriver.Backend].
func (ib *Inbox) PurgeProcessed(ctx context.Context, olderThan time.Duration, limit int) (int64, error) {
	if olderThan < 0 || limit < 0 || limit > inboxdriver.MaxBatch {
		return 0, fmt.Errorf("%w: idemsqlite: purge: olderThan must not be negative and limit must be 0..%d", idem.ErrInvalidConfig, inboxdriver.MaxBatch)
	}
	if limit == 0 {
		limit = DefaultPurgeBatch
	}
	return ib.t.batches(ctx, "inbox purge", limit, func(tx *sql.Tx, now int64) (sql.Result, error) {
		return tx.ExecContext(ctx, `DELETE FROM idem_inbox WHERE id IN (
	SELECT id FROM idem_inbox WHERE state = 'processed' AND processed_at <= ? LIMIT ?)`, now-durMicros(olderThan), limit)
	})
}

// Stats implements [inboxdriver.Admin].
func (ib *Inbox) Stats(ctx context.Context) ([]inboxdriver.StateCount, error) {
	return countStates(ctx, ib.t, "inbox stats", `SELECT state, count(*), min(received_at) FROM idem_inbox GROUP BY state`, inboxdriver.States())
}

// List implements [inboxdriver.Admin].
func (ib *Inbox) List(ctx context.Context, req inboxdriver.ListRequest) ([]inboxdriver.Row, error) {
	limit, err := inboxdriver.ListLimit(req)
	if err != nil {
		return nil, err
	}
	return listRows(ctx, ib.t, "inbox list", scanInboxRow, `SELECT `+inboxColumns+` FROM idem_inbox WHERE state = ? AND id > ? ORDER BY id LIMIT ?`,
		string(req.State), req.AfterID, limit)
}

// Get implements [inboxdriver.Admin].
func (ib *Inbox) Get(ctx context.Context, id int64) (inboxdriver.Row, []inboxdriver.Attempt, error) {
	r, err := scanInboxRow(ib.s.db.QueryRowContext(ctx, `SELECT `+inboxColumns+` FROM idem_inbox WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return inboxdriver.Row{}, nil, fmt.Errorf("idemsqlite: inbox row %d: %w", id, idem.ErrNotFound)
	}
	if err != nil {
		return inboxdriver.Row{}, nil, ib.wrap("inbox get", err)
	}
	rows, err := ib.s.db.QueryContext(ctx, `SELECT attempt, at, error FROM idem_inbox_attempts WHERE inbox_id = ? ORDER BY attempt`, id)
	if err != nil {
		return inboxdriver.Row{}, nil, ib.wrap("inbox get", err)
	}
	defer rows.Close()
	var hist []inboxdriver.Attempt
	for rows.Next() {
		var (
			a  inboxdriver.Attempt
			at int64
		)
		if err := rows.Scan(&a.Number, &at, &a.Error); err != nil {
			return inboxdriver.Row{}, nil, ib.wrap("inbox get", err)
		}
		a.At = time.UnixMicro(at)
		hist = append(hist, a)
	}
	if err := rows.Err(); err != nil {
		return inboxdriver.Row{}, nil, ib.wrap("inbox get", err)
	}
	return r, hist, nil
}

// Redrive implements [inboxdriver.Admin].
func (ib *Inbox) Redrive(ctx context.Context, sel inboxdriver.Select) (int64, error) {
	return ib.deadBatches(ctx, "inbox redrive", sel, func(now int64) (string, []any) {
		return `UPDATE idem_inbox SET state = 'pending', attempts = 0, dead_reason = NULL, next_attempt_at = ? WHERE id IN `, []any{now}
	})
}

// Discard implements [inboxdriver.Admin].
func (ib *Inbox) Discard(ctx context.Context, sel inboxdriver.Select) (int64, error) {
	return ib.deadBatches(ctx, "inbox discard", sel, func(int64) (string, []any) {
		return `DELETE FROM idem_inbox WHERE id IN `, nil
	})
}

func (ib *Inbox) deadBatches(ctx context.Context, op string, sel inboxdriver.Select, head func(now int64) (string, []any)) (int64, error) {
	if err := inboxdriver.ValidateSelect(sel); err != nil {
		return 0, err
	}
	return ib.t.deadBatches(ctx, op, sel, head)
}
