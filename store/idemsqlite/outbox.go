package idemsqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/outbox/outboxdriver"
)

// Outbox is the outbox table of a store's database: an
// [outboxdriver.Backend] that writes events in the caller's *sql.Tx. Get
// it with [Store.Outbox]. Claims go through the store's write queue and
// SQLite's single writer (BEGIN IMMEDIATE), so concurrent relays never
// claim the same event; marks and failures go ahead of claims in the queue,
// as lease holders do.
type Outbox struct {
	s *Store
	t stateTable
}

var _ outboxdriver.Backend[*sql.Tx] = (*Outbox)(nil)

// Outbox returns the store's outbox (migration 3 creates its table).
func (s *Store) Outbox() *Outbox { return &Outbox{s: s, t: stateTable{s: s, name: "idem_outbox"}} }

const outboxColumns = `id, event_id, topic, event_key, payload, headers, state, attempts, token,
	coalesce(last_error, ''), coalesce(dead_reason, ''), created_at, next_attempt_at, last_attempt_at, finished_at`

func scanOutboxRow(row scanner) (outboxdriver.Row, error) {
	var (
		r                outboxdriver.Row
		state, headers   string
		created, next    int64
		lastTry, finish  sql.NullInt64
		payload, lastErr []byte
	)
	if err := row.Scan(&r.ID, &r.EventID, &r.Topic, &r.Key, &payload, &headers, &state, &r.Attempts, &r.Token,
		&lastErr, &r.DeadReason, &created, &next, &lastTry, &finish); err != nil {
		return outboxdriver.Row{}, err
	}
	h, err := outboxdriver.DecodeHeaders(headers)
	if err != nil {
		return outboxdriver.Row{}, fmt.Errorf("row %d: %w", r.ID, err)
	}
	r.Payload, r.Headers, r.LastError = append([]byte{}, payload...), h, string(lastErr)
	r.State = outboxdriver.State(state)
	r.CreatedAt, r.NextAttemptAt = time.UnixMicro(created), time.UnixMicro(next)
	r.LastAttemptAt, r.FinishedAt = fromMicros(lastTry), fromMicros(finish)
	r.Finish()
	return r, nil
}

func (ob *Outbox) wrap(op string, err error) error { return ob.t.wrap(op, err) }

// Write implements [outboxdriver.Writer]: every event is validated first,
// then all go in one multi-row INSERT … ON CONFLICT (event_id) DO NOTHING
// in tx. Open the database like [OpenDB] does (BEGIN IMMEDIATE), or a
// transaction that read first may fail with a retryable busy error.
func (ob *Outbox) Write(ctx context.Context, tx *sql.Tx, evs ...outboxdriver.Event) error {
	if tx == nil {
		return fmt.Errorf("%w: idemsqlite: nil transaction", idem.ErrInvalidConfig)
	}
	evs, err := outboxdriver.PrepareAll(evs)
	if err != nil {
		return err
	}
	now := micros(ob.s.now())
	args := make([]any, 0, 5*len(evs)+1)
	args = append(args, now)
	for _, ev := range evs {
		args = append(args, ev.ID, ev.Topic, ev.Key, ev.Payload, outboxdriver.EncodeHeaders(ev.Headers))
	}
	// ?1 is the write time of every row; the others are numbered too, as
	// SQLite numbers a bare ? after the largest number used before it.
	var values strings.Builder
	for i := range evs {
		if i > 0 {
			values.WriteString(", ")
		}
		n := 2 + 5*i
		fmt.Fprintf(&values, "(?%d, ?%d, ?%d, ?%d, ?%d, ?1, ?1)", n, n+1, n+2, n+3, n+4)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO idem_outbox (event_id, topic, event_key, payload, headers, created_at, next_attempt_at)
VALUES `+values.String()+` ON CONFLICT (event_id) DO NOTHING`, args...); err != nil {
		return ob.wrap("outbox write", err)
	}
	return nil
}

// Claim implements [outboxdriver.Driver]: it selects and leases due events
// in one BEGIN IMMEDIATE transaction, so no other writer can claim them
// meanwhile; when a read shows nothing due it takes no write lock at all.
func (ob *Outbox) Claim(ctx context.Context, req outboxdriver.ClaimRequest) ([]outboxdriver.Row, error) {
	if err := outboxdriver.ValidateClaim(req); err != nil {
		return nil, err
	}
	// An idle relay polls often: a plain read (WAL readers never wait for
	// the writer) finds that nothing is due without taking the write lock
	// the producers' transactions need.
	var due bool
	if err := ob.s.db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM idem_outbox
	WHERE state IN ('pending', 'sending') AND next_attempt_at <= ?)`, micros(ob.s.now())).Scan(&due); err != nil {
		return nil, ob.wrap("outbox claim", err)
	}
	if !due {
		return nil, nil
	}
	var out []outboxdriver.Row
	err := ob.s.inTx(ctx, "outbox claim", func(tx *sql.Tx, now int64) error {
		out = out[:0]
		query := `SELECT id FROM idem_outbox AS o WHERE state IN ('pending', 'sending') AND next_attempt_at <= ?`
		if req.Ordered {
			query += ` AND (o.event_key = '' OR NOT EXISTS (SELECT 1 FROM idem_outbox AS e
	WHERE e.event_key = o.event_key AND e.id < o.id AND e.state IN ('pending', 'sending', 'dead')))`
		}
		query += ` ORDER BY next_attempt_at, id LIMIT ?`
		ids, err := queryIDs(ctx, tx, query, now, req.Limit)
		if err != nil {
			return ob.wrap("outbox claim", err)
		}
		if len(ids) == 0 {
			return nil
		}
		var top int64
		if err := tx.QueryRowContext(ctx, `UPDATE idem_outbox_token_counter SET value = value + ? WHERE id = 1 RETURNING value`,
			len(ids)).Scan(&top); err != nil {
			return ob.wrap("outbox claim: token", err)
		}
		until := now + durMicros(req.Lease)
		for i, id := range ids {
			r, err := scanOutboxRow(tx.QueryRowContext(ctx, `UPDATE idem_outbox SET state = 'sending', token = ?, next_attempt_at = ?,
	last_attempt_at = ? WHERE id = ? RETURNING `+outboxColumns, top-int64(len(ids)-1-i), until, now, id))
			if err != nil {
				return ob.wrap("outbox claim", err)
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

// queryIDs reads a column of ids.
func queryIDs(ctx context.Context, q execQuerier, query string, args ...any) ([]int64, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			_ = rows.Close()
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, errors.Join(rows.Err(), rows.Close())
}

// MarkSent implements [outboxdriver.Driver].
func (ob *Outbox) MarkSent(ctx context.Context, ls []outboxdriver.Lease) ([]int64, error) {
	return ob.t.held(ctx, "outbox mark sent", ls, `UPDATE idem_outbox SET state = 'sent', finished_at = ?, next_attempt_at = ?
WHERE id = ? AND token = ? AND state = 'sending'`, func(_ int, now int64) []any { return []any{now, now} })
}

// Fail implements [outboxdriver.Driver].
func (ob *Outbox) Fail(ctx context.Context, reqs []outboxdriver.FailRequest) ([]int64, error) {
	ls := make([]outboxdriver.Lease, len(reqs))
	for i, r := range reqs {
		ls[i] = r.Lease
	}
	return ob.t.held(ctx, "outbox fail", ls, `UPDATE idem_outbox SET state = ?, attempts = attempts + ?, last_error = ?, dead_reason = ?,
	finished_at = ?, next_attempt_at = ? WHERE id = ? AND token = ? AND state = 'sending'`, func(i int, now int64) []any {
		r := reqs[i]
		state, add, reason, finished := "pending", 1, sql.NullString{}, sql.NullInt64{}
		if r.Dead {
			state, reason, finished = "dead", sql.NullString{String: outboxdriver.CutError(string(r.DeadReason)), Valid: true}, sql.NullInt64{Int64: now, Valid: true}
		}
		if r.Uncounted {
			add = 0
		}
		return []any{state, add, outboxdriver.CutError(r.Error), reason, finished, now + durMicros(max(r.Delay, 0))}
	})
}

// Release implements [outboxdriver.Driver].
func (ob *Outbox) Release(ctx context.Context, ls []outboxdriver.Lease) (int64, error) {
	done, err := ob.t.held(ctx, "outbox release", ls, `UPDATE idem_outbox SET state = 'pending', next_attempt_at = ?
WHERE id = ? AND token = ? AND state = 'sending'`, func(_ int, now int64) []any { return []any{now} })
	return int64(len(done)), err
}

// PurgeSent implements [outboxdriver.Admin].
func (ob *Outbox) PurgeSent(ctx context.Context, olderThan time.Duration, limit int) (int64, error) {
	limit, err := outboxdriver.ValidatePurge(olderThan, limit, DefaultPurgeBatch)
	if err != nil {
		return 0, err
	}
	return ob.t.batches(ctx, "outbox purge", limit, func(tx *sql.Tx, now int64) (sql.Result, error) {
		return tx.ExecContext(ctx, `DELETE FROM idem_outbox WHERE id IN (
	SELECT id FROM idem_outbox WHERE state = 'sent' AND finished_at <= ? LIMIT ?)`, now-durMicros(olderThan), limit)
	})
}

// Stats implements [outboxdriver.Admin].
func (ob *Outbox) Stats(ctx context.Context) ([]outboxdriver.StateCount, error) {
	return countStates(ctx, ob.t, "outbox stats", `SELECT state, count(*), min(created_at) FROM idem_outbox GROUP BY state`, outboxdriver.States())
}

// List implements [outboxdriver.Admin].
func (ob *Outbox) List(ctx context.Context, req outboxdriver.ListRequest) ([]outboxdriver.Row, error) {
	limit, err := outboxdriver.ListLimit(req)
	if err != nil {
		return nil, err
	}
	return listRows(ctx, ob.t, "outbox list", scanOutboxRow, `SELECT `+outboxColumns+` FROM idem_outbox WHERE state = ? AND id > ? ORDER BY id LIMIT ?`,
		string(req.State), req.AfterID, limit)
}

// Get implements [outboxdriver.Admin].
func (ob *Outbox) Get(ctx context.Context, id int64) (outboxdriver.Row, error) {
	return ob.getOne(ctx, `id = ?`, id)
}

// GetByEventID implements [outboxdriver.Admin].
func (ob *Outbox) GetByEventID(ctx context.Context, eventID string) (outboxdriver.Row, error) {
	return ob.getOne(ctx, `event_id = ?`, eventID)
}

func (ob *Outbox) getOne(ctx context.Context, where string, arg any) (outboxdriver.Row, error) {
	r, err := scanOutboxRow(ob.s.db.QueryRowContext(ctx, `SELECT `+outboxColumns+` FROM idem_outbox WHERE `+where, arg))
	if errors.Is(err, sql.ErrNoRows) {
		return outboxdriver.Row{}, outboxdriver.NotFound("idemsqlite", fmt.Sprintf("%q", fmt.Sprint(arg)))
	}
	if err != nil {
		return outboxdriver.Row{}, ob.wrap("outbox get", err)
	}
	return r, nil
}

// Redrive implements [outboxdriver.Admin].
func (ob *Outbox) Redrive(ctx context.Context, sel outboxdriver.Select) (int64, error) {
	return ob.deadBatches(ctx, "outbox redrive", sel, func(now int64) (string, []any) {
		return `UPDATE idem_outbox SET state = 'pending', attempts = 0, dead_reason = NULL, finished_at = NULL, next_attempt_at = ?
WHERE id IN `, []any{now}
	})
}

// Discard implements [outboxdriver.Admin].
func (ob *Outbox) Discard(ctx context.Context, sel outboxdriver.Select) (int64, error) {
	return ob.deadBatches(ctx, "outbox discard", sel, func(int64) (string, []any) {
		return `DELETE FROM idem_outbox WHERE id IN `, nil
	})
}

func (ob *Outbox) deadBatches(ctx context.Context, op string, sel outboxdriver.Select, head func(now int64) (string, []any)) (int64, error) {
	if err := outboxdriver.ValidateSelect(sel); err != nil {
		return 0, err
	}
	return ob.t.deadBatches(ctx, op, sel, head)
}
