package idemmysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/outbox/outboxdriver"
)

// Outbox is the outbox table of a store's database: an
// [outboxdriver.Backend] that writes events in the caller's *sql.Tx and
// serves the relay's claims with FOR UPDATE SKIP LOCKED (MySQL 8.0,
// MariaDB 10.6). Get it with [Store.Outbox]; it is safe for concurrent use.
type Outbox struct{ s *Store }

var _ outboxdriver.Backend[*sql.Tx] = (*Outbox)(nil)

// Outbox returns the store's outbox (migration 3 creates its table).
func (s *Store) Outbox() *Outbox { return &Outbox{s: s} }

// outboxColumns is the column list scanOutboxRow reads.
const outboxColumns = "id, event_id, topic, event_key, payload, headers, state, attempts, token, " +
	"COALESCE(last_error, ''), COALESCE(dead_reason, ''), created_at, next_attempt_at, last_attempt_at, finished_at"

func scanOutboxRow(row scanner) (outboxdriver.Row, error) {
	var (
		r                              outboxdriver.Row
		id, topic, key, headers, state []byte
		lastErr, dead                  string
		created, next, lastTry, finish dbTime
	)
	if err := row.Scan(&r.ID, &id, &topic, &key, &r.Payload, &headers, &state, &r.Attempts, &r.Token,
		&lastErr, &dead, &created, &next, &lastTry, &finish); err != nil {
		return outboxdriver.Row{}, err
	}
	h, err := outboxdriver.DecodeHeaders(string(headers))
	if err != nil {
		return outboxdriver.Row{}, fmt.Errorf("row %d: %w", r.ID, err)
	}
	r.EventID, r.Topic, r.Key, r.Headers, r.State = string(id), string(topic), string(key), h, outboxdriver.State(state)
	r.LastError, r.DeadReason = lastErr, idem.DeadReason(dead)
	r.CreatedAt, r.NextAttemptAt, r.LastAttemptAt, r.FinishedAt = created.time(), next.time(), lastTry.time(), finish.time()
	r.Finish()
	return r, nil
}

// Write implements [outboxdriver.Writer]: every event is validated first,
// then all go in one multi-row INSERT in tx; an id already in the outbox
// is skipped (ON DUPLICATE KEY UPDATE id = id), so tx stays usable.
func (ob *Outbox) Write(ctx context.Context, tx *sql.Tx, evs ...outboxdriver.Event) error {
	if tx == nil {
		return fmt.Errorf("%w: idemmysql: nil transaction", idem.ErrInvalidConfig)
	}
	evs, err := outboxdriver.PrepareAll(evs)
	if err != nil {
		return err
	}
	args := make([]any, 0, 5*len(evs))
	for _, ev := range evs {
		args = append(args, ev.ID, ev.Topic, ev.Key, ev.Payload, outboxdriver.EncodeHeaders(ev.Headers))
	}
	values := repeatJoin("(?, ?, ?, ?, ?, "+nowSQL+", "+nowSQL+")", ", ", len(evs))
	if _, err := tx.ExecContext(ctx, "INSERT INTO idem_outbox (event_id, topic, event_key, payload, headers, created_at, next_attempt_at) VALUES "+
		values+" ON DUPLICATE KEY UPDATE id = id", args...); err != nil {
		return ob.s.wrap("outbox write", err)
	}
	return nil
}

// Claim implements [outboxdriver.Driver]: one transaction locks the oldest
// due events no other claim holds (FOR UPDATE SKIP LOCKED over the index
// of unfinished events), gives them one fresh fencing token and a lease,
// and reads them back.
func (ob *Outbox) Claim(ctx context.Context, req outboxdriver.ClaimRequest) ([]outboxdriver.Row, error) {
	if err := outboxdriver.ValidateClaim(req); err != nil {
		return nil, err
	}
	// open_key is set for events that are not sent: they hold their key
	// back. The subquery is a plain read, so it sees events other claims
	// hold locked.
	ordered := ""
	if req.Ordered {
		ordered = " AND (o.event_key = '' OR NOT EXISTS (SELECT 1 FROM idem_outbox AS e WHERE e.open_key = o.event_key AND e.id < o.id))"
	}
	var out []outboxdriver.Row
	err := ob.s.inTx(ctx, "outbox claim", func(tx *sql.Tx) (bool, error) {
		ids, err := lockedIDs(ctx, tx, "SELECT o.id FROM idem_outbox AS o WHERE o.due_at <= "+nowSQL+ordered+
			" ORDER BY o.due_at, o.id LIMIT ? FOR UPDATE SKIP LOCKED", req.Limit)
		if err != nil {
			return false, ob.s.wrap("outbox claim", err)
		}
		if len(ids) == 0 {
			return false, nil
		}
		token, err := newToken(ctx, tx, "idem_outbox_tokens")
		if err != nil {
			return false, ob.s.wrap("outbox claim: next token", err)
		}
		in := placeholders(len(ids))
		args := append([]any{token, micros(req.Lease)}, ids...)
		if _, err := tx.ExecContext(ctx, "UPDATE idem_outbox SET state = 'sending', token = ?, next_attempt_at = "+nowSQL+
			" + INTERVAL ? MICROSECOND, last_attempt_at = "+nowSQL+" WHERE id IN ("+in+")", args...); err != nil {
			return false, ob.s.wrap("outbox claim", err)
		}
		out, err = queryRows(ctx, tx, scanOutboxRow, "SELECT "+outboxColumns+" FROM idem_outbox WHERE id IN ("+in+") ORDER BY id", ids...)
		if err != nil {
			return false, ob.s.wrap("outbox claim", err)
		}
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// held locks the events of ls whose lease is current and runs change on
// their ids, in one transaction; it returns those ids.
func (ob *Outbox) held(ctx context.Context, op string, ls []outboxdriver.Lease, change func(tx *sql.Tx, ids []any) error) ([]int64, error) {
	if len(ls) == 0 {
		return nil, nil
	}
	where, args := leaseFilter("sending", ls)
	var out []int64
	err := ob.s.inTx(ctx, op, func(tx *sql.Tx) (bool, error) {
		ids, err := lockedIDs(ctx, tx, "SELECT id FROM idem_outbox WHERE "+where+" FOR UPDATE", args...)
		if err != nil {
			return false, ob.s.wrap(op, err)
		}
		if len(ids) == 0 {
			return false, nil
		}
		if err := change(tx, ids); err != nil {
			return false, ob.s.wrap(op, err)
		}
		out = make([]int64, len(ids))
		for i, id := range ids {
			out[i] = id.(int64)
		}
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// MarkSent implements [outboxdriver.Driver].
func (ob *Outbox) MarkSent(ctx context.Context, ls []outboxdriver.Lease) ([]int64, error) {
	return ob.held(ctx, "outbox mark sent", ls, func(tx *sql.Tx, ids []any) error {
		_, err := tx.ExecContext(ctx, "UPDATE idem_outbox SET state = 'sent', finished_at = "+nowSQL+", next_attempt_at = "+nowSQL+
			" WHERE id IN ("+placeholders(len(ids))+")", ids...)
		return err
	})
}

// Fail implements [outboxdriver.Driver]; the next attempts are scheduled by
// the database clock.
func (ob *Outbox) Fail(ctx context.Context, reqs []outboxdriver.FailRequest) ([]int64, error) {
	ls := make([]outboxdriver.Lease, len(reqs))
	byID := make(map[int64]outboxdriver.FailRequest, len(reqs))
	for i, r := range reqs {
		ls[i], byID[r.ID] = r.Lease, r
	}
	return ob.held(ctx, "outbox fail", ls, func(tx *sql.Tx, ids []any) error {
		for _, id := range ids {
			r := byID[id.(int64)]
			state, counted := outboxdriver.StatePending, 1
			var dead any // NULL unless the event dies
			finished := "NULL"
			if r.Dead {
				state, dead, finished = outboxdriver.StateDead, outboxdriver.CutError(string(r.DeadReason)), nowSQL
			}
			if r.Uncounted {
				counted = 0
			}
			if _, err := tx.ExecContext(ctx, "UPDATE idem_outbox SET state = ?, attempts = attempts + ?, last_error = ?, dead_reason = ?,"+
				" finished_at = "+finished+", next_attempt_at = "+nowSQL+" + INTERVAL ? MICROSECOND WHERE id = ?",
				string(state), counted, outboxdriver.CutError(r.Error), dead, micros(max(r.Delay, 0)), r.ID); err != nil {
				return err
			}
		}
		return nil
	})
}

// Release implements [outboxdriver.Driver].
func (ob *Outbox) Release(ctx context.Context, ls []outboxdriver.Lease) (int64, error) {
	return ob.s.releaseLeases(ctx, "outbox release", "idem_outbox", "sending", ls)
}

// PurgeSent implements [outboxdriver.Admin]: batches of at most limit
// events, each locked with SKIP LOCKED and deleted in a short transaction
// of its own; then the spent rows of the outbox's token counter.
func (ob *Outbox) PurgeSent(ctx context.Context, olderThan time.Duration, limit int) (int64, error) {
	limit, err := outboxdriver.ValidatePurge(olderThan, limit, min(ob.s.cfg.PurgeBatch, outboxdriver.MaxBatch))
	if err != nil {
		return 0, err
	}
	return ob.s.purgeFinished(ctx, "outbox purge", "idem_outbox", "sent", "finished_at", "idem_outbox_tokens", olderThan, limit)
}

// Stats implements [outboxdriver.Admin].
func (ob *Outbox) Stats(ctx context.Context) ([]outboxdriver.StateCount, error) {
	return countStates(ctx, ob.s, "outbox stats", "SELECT state, COUNT(*), COALESCE(TIMESTAMPDIFF(MICROSECOND, MIN(created_at), "+nowSQL+"), 0)"+
		" FROM idem_outbox GROUP BY state", outboxdriver.States())
}

// List implements [outboxdriver.Admin].
func (ob *Outbox) List(ctx context.Context, req outboxdriver.ListRequest) ([]outboxdriver.Row, error) {
	limit, err := outboxdriver.ListLimit(req)
	if err != nil {
		return nil, err
	}
	return listRows(ctx, ob.s, "outbox list", scanOutboxRow, "SELECT "+outboxColumns+" FROM idem_outbox WHERE state = ? AND id > ? ORDER BY id LIMIT ?",
		string(req.State), req.AfterID, limit)
}

// Get implements [outboxdriver.Admin].
func (ob *Outbox) Get(ctx context.Context, id int64) (outboxdriver.Row, error) {
	return ob.getOne(ctx, "id = ?", id)
}

// GetByEventID implements [outboxdriver.Admin].
func (ob *Outbox) GetByEventID(ctx context.Context, eventID string) (outboxdriver.Row, error) {
	return ob.getOne(ctx, "event_id = ?", eventID)
}

func (ob *Outbox) getOne(ctx context.Context, where string, arg any) (outboxdriver.Row, error) {
	r, err := scanOutboxRow(ob.s.db.QueryRowContext(ctx, "SELECT "+outboxColumns+" FROM idem_outbox WHERE "+where, arg))
	if errors.Is(err, sql.ErrNoRows) {
		return outboxdriver.Row{}, outboxdriver.NotFound("idemmysql", fmt.Sprintf("%q", fmt.Sprint(arg)))
	}
	if err != nil {
		return outboxdriver.Row{}, ob.s.wrap("outbox get", err)
	}
	return r, nil
}

// Redrive implements [outboxdriver.Admin].
func (ob *Outbox) Redrive(ctx context.Context, sel outboxdriver.Select) (int64, error) {
	return ob.deadBatches(ctx, "outbox redrive", sel, func(tx *sql.Tx, ids []any) (sql.Result, error) {
		return tx.ExecContext(ctx, "UPDATE idem_outbox SET state = 'pending', attempts = 0, dead_reason = NULL, finished_at = NULL,"+
			" next_attempt_at = "+nowSQL+" WHERE id IN ("+placeholders(len(ids))+")", ids...)
	})
}

// Discard implements [outboxdriver.Admin].
func (ob *Outbox) Discard(ctx context.Context, sel outboxdriver.Select) (int64, error) {
	return ob.deadBatches(ctx, "outbox discard", sel, func(tx *sql.Tx, ids []any) (sql.Result, error) {
		return tx.ExecContext(ctx, "DELETE FROM idem_outbox WHERE id IN ("+placeholders(len(ids))+")", ids...)
	})
}

func (ob *Outbox) deadBatches(ctx context.Context, op string, sel outboxdriver.Select, change func(tx *sql.Tx, ids []any) (sql.Result, error)) (int64, error) {
	if err := outboxdriver.ValidateSelect(sel); err != nil {
		return 0, err
	}
	return ob.s.deadBatches(ctx, op, "idem_outbox", sel, min(ob.s.cfg.PurgeBatch, outboxdriver.MaxBatch), change)
}
