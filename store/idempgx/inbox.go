package idempgx

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox/inboxdriver"
	"github.com/idem-go/idem/internal/statetable"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Inbox is the inbox table of a store's schema: an [inboxdriver.Backend] whose
// handlers get the pgx.Tx that also marks their message processed. Get it
// with [Store.Inbox]; it is safe for concurrent use.
type Inbox struct {
	s  *Store
	q  inboxQueries
	sq string // the token sequence, quoted, passed as a regclass parameter
}

var _ inboxdriver.Backend[pgx.Tx] = (*Inbox)(nil)

// Inbox returns the store's inbox (migration 2 creates its tables).
func (s *Store) Inbox() *Inbox {
	return &Inbox{s: s, q: newInboxQueries(s.schema), sq: pgx.Identifier{s.schema, "idem_inbox_token_seq"}.Sanitize()}
}

type inboxQueries struct {
	receive, receiveLookup, claim, claimOrdered, complete, fail, extend, release, purge string
	stats, list, get, attempts, redrive, discard                                        string
}

// inboxColumns is the column list scanInboxRow reads, each qualified with p.
func inboxColumns(p string) string {
	return p + `id, ` + p + `source, ` + p + `message_id, ` + p + `type, ` + p + `payload, ` + p + `ordering_key, ` +
		p + `fingerprint, ` + p + `state, ` + p + `attempts, ` + p + `token, coalesce(` + p + `last_error, ''), coalesce(` +
		p + `dead_reason, ''), ` + p + `received_at, ` + p + `next_attempt_at, ` + p + `processed_at`
}

func newInboxQueries(schema string) inboxQueries {
	t := pgx.Identifier{schema, "idem_inbox"}.Sanitize()
	a := pgx.Identifier{schema, "idem_inbox_attempts"}.Sanitize()
	// claim locks the oldest due rows that no other claim holds (SKIP
	// LOCKED), so concurrent workers never wait on each other. Locking
	// re-checks the WHERE clause against the newest row version, so a row
	// completed since the snapshot is not taken over.
	//
	// The outer UPDATE matches the locked ids with id = ANY(ARRAY(…)) rather
	// than a join: pgx prepares statements, and a generic plan cannot see
	// the LIMIT and would hash-join the whole table.
	claim := func(extra string) string {
		return `UPDATE ` + t + ` AS i SET state = 'running', token = nextval($3::regclass),
	next_attempt_at = now() + $2 * interval '1 microsecond'
WHERE i.id = ANY(ARRAY(
	SELECT id FROM ` + t + ` AS i
	WHERE state IN ('pending', 'running') AND next_attempt_at <= now()` + extra + `
	ORDER BY next_attempt_at, id LIMIT $1 FOR UPDATE SKIP LOCKED))
RETURNING ` + inboxColumns("i.")
	}
	// A row whose selection touches its own dead rows would block the key
	// forever; only unfinished earlier rows hold a key back.
	ordered := `
	AND (i.ordering_key = '' OR NOT EXISTS (SELECT 1 FROM ` + t + ` AS e
		WHERE e.ordering_key = i.ordering_key AND e.id < i.id AND e.state IN ('pending', 'running')))`
	leases := `WHERE i.id = ANY($1) AND i.state = 'running'
	AND (i.id, i.token) IN (SELECT * FROM unnest($1::bigint[], $2::bigint[]))`
	// The selection is bounded and re-run until empty, so redriving or
	// discarding a large dead set never holds one long transaction.
	deadBatch := `i.id = ANY(ARRAY(SELECT id FROM ` + t + ` WHERE state = 'dead' AND ($2 OR id = ANY($1))
	ORDER BY id LIMIT $3 FOR UPDATE SKIP LOCKED))`
	return inboxQueries{
		receive: `INSERT INTO ` + t + ` (source, message_id, type, payload, ordering_key, fingerprint)
VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (source, message_id) DO NOTHING RETURNING id`,
		receiveLookup: `SELECT id, fingerprint FROM ` + t + ` WHERE source = $1 AND message_id = $2`,
		claim:         claim(""),
		claimOrdered:  claim(ordered),
		complete: `UPDATE ` + t + ` SET state = 'processed', processed_at = now(), next_attempt_at = now()
WHERE id = $1 AND token = $2 AND state = 'running'`,
		fail: `WITH u AS (
	UPDATE ` + t + ` SET state = CASE WHEN $5 THEN 'dead' ELSE 'pending' END,
		attempts = attempts + CASE WHEN $7 THEN 0 ELSE 1 END,
		last_error = $3, dead_reason = CASE WHEN $5 THEN $6 END,
		next_attempt_at = now() + $4 * interval '1 microsecond'
	WHERE id = $1 AND token = $2 AND state = 'running' RETURNING id),
h AS (
	INSERT INTO ` + a + ` (inbox_id, attempt, error)
	SELECT u.id, coalesce((SELECT max(attempt) FROM ` + a + ` WHERE inbox_id = u.id), 0) + 1, $3
	FROM u WHERE NOT $7)
SELECT count(*) FROM u`,
		extend: `UPDATE ` + t + ` AS i SET next_attempt_at = now() + $3 * interval '1 microsecond'
` + leases + ` RETURNING i.id`,
		release: `UPDATE ` + t + ` AS i SET state = 'pending', next_attempt_at = now()
` + leases,
		purge: `DELETE FROM ` + t + ` WHERE id = ANY(ARRAY(SELECT id FROM ` + t + `
	WHERE state = 'processed' AND processed_at <= now() - $1 * interval '1 microsecond'
	LIMIT $2 FOR UPDATE SKIP LOCKED))`,
		stats: `SELECT state, count(*), coalesce(extract(epoch FROM now() - min(received_at)), 0)::float8
FROM ` + t + ` GROUP BY state`,
		list:     `SELECT ` + inboxColumns("") + ` FROM ` + t + ` WHERE state = $1 AND id > $2 ORDER BY id LIMIT $3`,
		get:      `SELECT ` + inboxColumns("") + ` FROM ` + t + ` WHERE id = $1`,
		attempts: `SELECT attempt, at, error FROM ` + a + ` WHERE inbox_id = $1 ORDER BY attempt`,
		redrive: `UPDATE ` + t + ` AS i SET state = 'pending', attempts = 0, dead_reason = NULL, next_attempt_at = now()
WHERE ` + deadBatch,
		discard: `DELETE FROM ` + t + ` AS i WHERE ` + deadBatch,
	}
}

func scanInboxRow(row pgx.Row) (inboxdriver.Row, error) {
	var (
		r     inboxdriver.Row
		fp    []byte
		state string
		done  *time.Time
	)
	if err := row.Scan(&r.ID, &r.Source, &r.MessageID, &r.Type, &r.Payload, &r.OrderingKey, &fp, &state,
		&r.Attempts, &r.Token, &r.LastError, &r.DeadReason, &r.ReceivedAt, &r.NextAttemptAt, &done); err != nil {
		return inboxdriver.Row{}, err
	}
	copy(r.Fingerprint[:], fp)
	r.State = inboxdriver.State(state)
	if r.State == inboxdriver.StateRunning {
		r.LeaseExpiresAt = r.NextAttemptAt
	}
	if done != nil {
		r.ProcessedAt = *done
	}
	return r, nil
}

// Receive implements [inboxdriver.Backend]: one INSERT … ON CONFLICT DO NOTHING.
func (ib *Inbox) Receive(ctx context.Context, msg inboxdriver.Message) (bool, error) {
	return ib.receive(ctx, ib.s.pool, msg)
}

// ReceiveTx is Receive in the caller's transaction: the message is in the
// inbox exactly when tx commits. A failed statement aborts tx; roll it back
// on any error.
func (ib *Inbox) ReceiveTx(ctx context.Context, tx pgx.Tx, msg inboxdriver.Message) (bool, error) {
	if tx == nil {
		return false, fmt.Errorf("%w: idempgx: nil transaction", idem.ErrInvalidConfig)
	}
	return ib.receive(ctx, tx, msg)
}

func (ib *Inbox) receive(ctx context.Context, q querier, msg inboxdriver.Message) (bool, error) {
	msg, err := inboxdriver.Prepare(msg)
	if err != nil {
		return false, err
	}
	for range maxRaceRetries {
		var id int64
		err := q.QueryRow(ctx, ib.q.receive, msg.Source, msg.ID, msg.Type, msg.Payload, msg.OrderingKey, msg.Fingerprint[:]).Scan(&id)
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return false, ib.s.wrap("inbox receive", err)
		}
		var fp []byte
		err = q.QueryRow(ctx, ib.q.receiveLookup, msg.Source, msg.ID).Scan(&id, &fp)
		if errors.Is(err, pgx.ErrNoRows) {
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
	return false, idem.Retryable(fmt.Errorf("idempgx: inbox receive %q: row kept changing", msg.ID))
}

// Claim implements [inboxdriver.Backend] with FOR UPDATE SKIP LOCKED over the
// partial index of unfinished rows.
func (ib *Inbox) Claim(ctx context.Context, req inboxdriver.ClaimRequest) ([]inboxdriver.Row, error) {
	if err := inboxdriver.ValidateClaim(req); err != nil {
		return nil, err
	}
	sql := ib.q.claim
	if req.Ordered {
		sql = ib.q.claimOrdered
	}
	rows, err := ib.s.pool.Query(ctx, sql, req.Limit, micros(req.Lease), ib.sq)
	return collectRows(ib.s, "inbox claim", scanInboxRow, rows, err)
}

// Complete implements [inboxdriver.Backend]: fn runs first, then the processed
// mark, guarded by the token, in the same transaction. Marking last keeps
// the row unlocked while fn runs, so heartbeats can extend its lease.
func (ib *Inbox) Complete(ctx context.Context, l inboxdriver.Lease, fn func(ctx context.Context, tx pgx.Tx) error) error {
	if fn == nil {
		return fmt.Errorf("%w: idempgx: nil handler", idem.ErrInvalidConfig)
	}
	op := fmt.Sprintf("inbox complete %d", l.ID)
	return ib.s.inTx(ctx, op, func(tx pgx.Tx) (bool, error) {
		if err := fn(ctx, tx); err != nil {
			return false, err
		}
		tag, err := tx.Exec(ctx, ib.q.complete, l.ID, l.Token)
		if err != nil {
			return false, ib.s.wrap(op, err)
		}
		if tag.RowsAffected() == 0 {
			return false, fmt.Errorf("idempgx: %s (token %d): %w", op, l.Token, idem.ErrLeaseLost)
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
	var n int64
	err := ib.s.pool.QueryRow(ctx, ib.q.fail, req.ID, req.Token, inboxdriver.CutError(req.Error), micros(req.Delay),
		req.Dead, inboxdriver.CutError(string(req.DeadReason)), req.Uncounted).Scan(&n)
	if err != nil {
		return ib.s.wrap("inbox fail", err)
	}
	if n == 0 {
		return fmt.Errorf("idempgx: inbox fail %d (token %d): %w", req.ID, req.Token, idem.ErrLeaseLost)
	}
	return nil
}

// Extend implements [inboxdriver.Backend].
func (ib *Inbox) Extend(ctx context.Context, ls []inboxdriver.Lease, lease time.Duration) ([]int64, error) {
	if lease <= 0 {
		return nil, fmt.Errorf("%w: idempgx: lease must be positive, got %v", idem.ErrInvalidConfig, lease)
	}
	if len(ls) == 0 {
		return nil, nil
	}
	ids, tokens := statetable.LeaseArrays(ls)
	rows, err := ib.s.pool.Query(ctx, ib.q.extend, ids, tokens, micros(lease))
	if err != nil {
		return nil, ib.s.wrap("inbox extend", err)
	}
	kept, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, ib.s.wrap("inbox extend", err)
	}
	return kept, nil
}

// Release implements [inboxdriver.Backend].
func (ib *Inbox) Release(ctx context.Context, ls []inboxdriver.Lease) (int64, error) {
	if len(ls) == 0 {
		return 0, nil
	}
	ids, tokens := statetable.LeaseArrays(ls)
	tag, err := ib.s.pool.Exec(ctx, ib.q.release, ids, tokens)
	if err != nil {
		return 0, ib.s.wrap("inbox release", err)
	}
	return tag.RowsAffected(), nil
}

// PurgeProcessed implements [inboxdriver.Backend].
func (ib *Inbox) PurgeProcessed(ctx context.Context, olderThan time.Duration, limit int) (int64, error) {
	if olderThan < 0 || limit < 0 || limit > MaxBatch {
		return 0, fmt.Errorf("%w: idempgx: purge: olderThan must not be negative and limit must be 0..%d", idem.ErrInvalidConfig, MaxBatch)
	}
	if limit == 0 {
		limit = ib.s.cfg.PurgeBatch
	}
	return ib.s.tableBatches(ctx, "inbox purge", limit, func() (pgconn.CommandTag, error) {
		return ib.s.pool.Exec(ctx, ib.q.purge, micros(olderThan), limit)
	})
}

// Stats implements [inboxdriver.Admin].
func (ib *Inbox) Stats(ctx context.Context) ([]inboxdriver.StateCount, error) {
	return countStates(ctx, ib.s, "inbox stats", ib.q.stats, inboxdriver.States())
}

// List implements [inboxdriver.Admin].
func (ib *Inbox) List(ctx context.Context, req inboxdriver.ListRequest) ([]inboxdriver.Row, error) {
	limit, err := inboxdriver.ListLimit(req)
	if err != nil {
		return nil, err
	}
	rows, err := ib.s.pool.Query(ctx, ib.q.list, string(req.State), req.AfterID, limit)
	return collectRows(ib.s, "inbox list", scanInboxRow, rows, err)
}

// Get implements [inboxdriver.Admin].
func (ib *Inbox) Get(ctx context.Context, id int64) (inboxdriver.Row, []inboxdriver.Attempt, error) {
	r, err := scanInboxRow(ib.s.pool.QueryRow(ctx, ib.q.get, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return inboxdriver.Row{}, nil, fmt.Errorf("idempgx: inbox row %d: %w", id, idem.ErrNotFound)
	}
	if err != nil {
		return inboxdriver.Row{}, nil, ib.s.wrap("inbox get", err)
	}
	rows, err := ib.s.pool.Query(ctx, ib.q.attempts, id)
	if err != nil {
		return inboxdriver.Row{}, nil, ib.s.wrap("inbox get", err)
	}
	hist, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (inboxdriver.Attempt, error) {
		var a inboxdriver.Attempt
		err := row.Scan(&a.Number, &a.At, &a.Error)
		return a, err
	})
	if err != nil {
		return inboxdriver.Row{}, nil, ib.s.wrap("inbox get", err)
	}
	return r, hist, nil
}

// Redrive implements [inboxdriver.Admin].
func (ib *Inbox) Redrive(ctx context.Context, sel inboxdriver.Select) (int64, error) {
	return ib.deadBatches(ctx, "inbox redrive", ib.q.redrive, sel)
}

// Discard implements [inboxdriver.Admin].
func (ib *Inbox) Discard(ctx context.Context, sel inboxdriver.Select) (int64, error) {
	return ib.deadBatches(ctx, "inbox discard", ib.q.discard, sel)
}

func (ib *Inbox) deadBatches(ctx context.Context, op, sql string, sel inboxdriver.Select) (int64, error) {
	if err := inboxdriver.ValidateSelect(sel); err != nil {
		return 0, err
	}
	return ib.s.deadBatches(ctx, op, sql, sel, ib.s.cfg.PurgeBatch)
}
