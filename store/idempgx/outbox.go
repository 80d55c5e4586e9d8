package idempgx

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/statetable"
	"github.com/idem-go/idem/outbox/outboxdriver"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Outbox is the outbox table of a store's schema: an
// [outboxdriver.Backend] that writes events in the caller's pgx.Tx and
// serves the relay's claims with FOR UPDATE SKIP LOCKED. Get it with
// [Store.Outbox]; it is safe for concurrent use.
type Outbox struct {
	s  *Store
	q  outboxQueries
	sq string // the token sequence, quoted, passed as a regclass parameter
}

var _ outboxdriver.Backend[pgx.Tx] = (*Outbox)(nil)

// Outbox returns the store's outbox (migration 3 creates its table).
func (s *Store) Outbox() *Outbox {
	return &Outbox{s: s, q: newOutboxQueries(s.schema), sq: pgx.Identifier{s.schema, "idem_outbox_token_seq"}.Sanitize()}
}

type outboxQueries struct {
	write, claim, claimOrdered, markSent, fail, release, purge string
	stats, list, get, getByEvent, redrive, discard             string
}

// outboxColumns is the column list scanOutboxRow reads, each qualified with p.
func outboxColumns(p string) string {
	return p + `id, ` + p + `event_id, ` + p + `topic, ` + p + `event_key, ` + p + `payload, ` + p + `headers, ` +
		p + `state, ` + p + `attempts, ` + p + `token, coalesce(` + p + `last_error, ''), coalesce(` + p + `dead_reason, ''), ` +
		p + `created_at, ` + p + `next_attempt_at, ` + p + `last_attempt_at, ` + p + `finished_at`
}

func newOutboxQueries(schema string) outboxQueries {
	t := pgx.Identifier{schema, "idem_outbox"}.Sanitize()
	// claim locks the oldest due events no other claim holds (SKIP
	// LOCKED); see the inbox's claim for why the UPDATE matches an ARRAY.
	claim := func(extra string) string {
		return `UPDATE ` + t + ` AS o SET state = 'sending', token = nextval($3::regclass),
	next_attempt_at = now() + $2 * interval '1 microsecond', last_attempt_at = now()
WHERE o.id = ANY(ARRAY(
	SELECT id FROM ` + t + ` AS o
	WHERE state IN ('pending', 'sending') AND next_attempt_at <= now()` + extra + `
	ORDER BY next_attempt_at, id LIMIT $1 FOR UPDATE SKIP LOCKED))
RETURNING ` + outboxColumns("o.")
	}
	// An event is held back by an earlier event of its key that is not
	// sent: unfinished, or dead (until redriven or discarded).
	ordered := `
	AND (o.event_key = '' OR NOT EXISTS (SELECT 1 FROM ` + t + ` AS e
		WHERE e.event_key = o.event_key AND e.id < o.id AND e.state IN ('pending', 'sending', 'dead')))`
	leases := `WHERE o.id = ANY($1) AND o.state = 'sending'
	AND (o.id, o.token) IN (SELECT * FROM unnest($1::bigint[], $2::bigint[]))`
	deadBatch := `o.id = ANY(ARRAY(SELECT id FROM ` + t + ` WHERE state = 'dead' AND ($2 OR id = ANY($1))
	ORDER BY id LIMIT $3 FOR UPDATE SKIP LOCKED))`
	return outboxQueries{
		// One statement for any number of events; unnest keeps their order,
		// so ids follow the order of the Write call.
		write: `INSERT INTO ` + t + ` (event_id, topic, event_key, payload, headers)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::text[])
ON CONFLICT (event_id) DO NOTHING`,
		claim:        claim(""),
		claimOrdered: claim(ordered),
		markSent: `UPDATE ` + t + ` AS o SET state = 'sent', finished_at = now(), next_attempt_at = now()
` + leases + ` RETURNING o.id`,
		fail: `UPDATE ` + t + ` AS o SET state = CASE WHEN f.dead THEN 'dead' ELSE 'pending' END,
	attempts = o.attempts + CASE WHEN f.uncounted THEN 0 ELSE 1 END,
	last_error = f.err, dead_reason = CASE WHEN f.dead THEN f.reason END,
	finished_at = CASE WHEN f.dead THEN now() END,
	next_attempt_at = now() + f.delay * interval '1 microsecond'
FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::bigint[], $5::bool[], $6::text[], $7::bool[])
	AS f(id, token, err, delay, dead, reason, uncounted)
WHERE o.id = f.id AND o.token = f.token AND o.state = 'sending'
RETURNING o.id`,
		release: `UPDATE ` + t + ` AS o SET state = 'pending', next_attempt_at = now()
` + leases,
		purge: `DELETE FROM ` + t + ` WHERE id = ANY(ARRAY(SELECT id FROM ` + t + `
	WHERE state = 'sent' AND finished_at <= now() - $1 * interval '1 microsecond'
	LIMIT $2 FOR UPDATE SKIP LOCKED))`,
		stats: `SELECT state, count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8
FROM ` + t + ` GROUP BY state`,
		list:       `SELECT ` + outboxColumns("") + ` FROM ` + t + ` WHERE state = $1 AND id > $2 ORDER BY id LIMIT $3`,
		get:        `SELECT ` + outboxColumns("") + ` FROM ` + t + ` WHERE id = $1`,
		getByEvent: `SELECT ` + outboxColumns("") + ` FROM ` + t + ` WHERE event_id = $1`,
		redrive: `UPDATE ` + t + ` AS o SET state = 'pending', attempts = 0, dead_reason = NULL, finished_at = NULL,
	next_attempt_at = now() WHERE ` + deadBatch,
		discard: `DELETE FROM ` + t + ` AS o WHERE ` + deadBatch,
	}
}

func scanOutboxRow(row pgx.Row) (outboxdriver.Row, error) {
	var (
		r               outboxdriver.Row
		headers, state  string
		lastTry, finish *time.Time
	)
	if err := row.Scan(&r.ID, &r.EventID, &r.Topic, &r.Key, &r.Payload, &headers, &state, &r.Attempts, &r.Token,
		&r.LastError, &r.DeadReason, &r.CreatedAt, &r.NextAttemptAt, &lastTry, &finish); err != nil {
		return outboxdriver.Row{}, err
	}
	h, err := outboxdriver.DecodeHeaders(headers)
	if err != nil {
		return outboxdriver.Row{}, fmt.Errorf("row %d: %w", r.ID, err)
	}
	r.Headers, r.State = h, outboxdriver.State(state)
	if lastTry != nil {
		r.LastAttemptAt = *lastTry
	}
	if finish != nil {
		r.FinishedAt = *finish
	}
	r.Finish()
	return r, nil
}

// Write implements [outboxdriver.Writer]: every event is validated first,
// then all go in one INSERT … SELECT FROM unnest(…) ON CONFLICT (event_id)
// DO NOTHING in tx. A failed statement aborts tx; roll it back on any
// error.
func (ob *Outbox) Write(ctx context.Context, tx pgx.Tx, evs ...outboxdriver.Event) error {
	if tx == nil {
		return fmt.Errorf("%w: idempgx: nil transaction", idem.ErrInvalidConfig)
	}
	evs, err := outboxdriver.PrepareAll(evs)
	if err != nil {
		return err
	}
	ids, topics, keys, headers := make([]string, len(evs)), make([]string, len(evs)), make([]string, len(evs)), make([]string, len(evs))
	payloads := make([][]byte, len(evs))
	for i, ev := range evs {
		ids[i], topics[i], keys[i], payloads[i], headers[i] = ev.ID, ev.Topic, ev.Key, ev.Payload, outboxdriver.EncodeHeaders(ev.Headers)
	}
	if _, err := tx.Exec(ctx, ob.q.write, ids, topics, keys, payloads, headers); err != nil {
		return ob.s.wrap("outbox write", err)
	}
	return nil
}

// Claim implements [outboxdriver.Driver] with FOR UPDATE SKIP LOCKED over
// the partial index of unfinished events.
func (ob *Outbox) Claim(ctx context.Context, req outboxdriver.ClaimRequest) ([]outboxdriver.Row, error) {
	if err := outboxdriver.ValidateClaim(req); err != nil {
		return nil, err
	}
	sql := ob.q.claim
	if req.Ordered {
		sql = ob.q.claimOrdered
	}
	rows, err := ob.s.pool.Query(ctx, sql, req.Limit, micros(req.Lease), ob.sq)
	out, err := collectRows(ob.s, "outbox claim", scanOutboxRow, rows, err)
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b outboxdriver.Row) int {
		return a.NextAttemptAt.Compare(b.NextAttemptAt)*2 + cmpInt(a.ID, b.ID)
	})
	return out, nil
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// MarkSent implements [outboxdriver.Driver].
func (ob *Outbox) MarkSent(ctx context.Context, ls []outboxdriver.Lease) ([]int64, error) {
	if len(ls) == 0 {
		return nil, nil
	}
	ids, tokens := statetable.LeaseArrays(ls)
	rows, err := ob.s.pool.Query(ctx, ob.q.markSent, ids, tokens)
	if err != nil {
		return nil, ob.s.wrap("outbox mark sent", err)
	}
	marked, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, ob.s.wrap("outbox mark sent", err)
	}
	return marked, nil
}

// Fail implements [outboxdriver.Driver]: one statement for the whole batch;
// the next attempts are scheduled by the database clock.
func (ob *Outbox) Fail(ctx context.Context, reqs []outboxdriver.FailRequest) ([]int64, error) {
	if len(reqs) == 0 {
		return nil, nil
	}
	n := len(reqs)
	ids, tokens, delays := make([]int64, n), make([]int64, n), make([]int64, n)
	errs, reasons := make([]string, n), make([]string, n)
	dead, uncounted := make([]bool, n), make([]bool, n)
	for i, r := range reqs {
		ids[i], tokens[i], delays[i] = r.ID, r.Token, micros(max(r.Delay, 0))
		errs[i], reasons[i] = outboxdriver.CutError(r.Error), outboxdriver.CutError(string(r.DeadReason))
		dead[i], uncounted[i] = r.Dead, r.Uncounted
	}
	rows, err := ob.s.pool.Query(ctx, ob.q.fail, ids, tokens, errs, delays, dead, reasons, uncounted)
	if err != nil {
		return nil, ob.s.wrap("outbox fail", err)
	}
	done, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, ob.s.wrap("outbox fail", err)
	}
	return done, nil
}

// Release implements [outboxdriver.Driver].
func (ob *Outbox) Release(ctx context.Context, ls []outboxdriver.Lease) (int64, error) {
	if len(ls) == 0 {
		return 0, nil
	}
	ids, tokens := statetable.LeaseArrays(ls)
	tag, err := ob.s.pool.Exec(ctx, ob.q.release, ids, tokens)
	if err != nil {
		return 0, ob.s.wrap("outbox release", err)
	}
	return tag.RowsAffected(), nil
}

// PurgeSent implements [outboxdriver.Admin].
func (ob *Outbox) PurgeSent(ctx context.Context, olderThan time.Duration, limit int) (int64, error) {
	limit, err := outboxdriver.ValidatePurge(olderThan, limit, min(ob.s.cfg.PurgeBatch, outboxdriver.MaxBatch))
	if err != nil {
		return 0, err
	}
	return ob.s.tableBatches(ctx, "outbox purge", limit, func() (pgconn.CommandTag, error) {
		return ob.s.pool.Exec(ctx, ob.q.purge, micros(olderThan), limit)
	})
}

// Stats implements [outboxdriver.Admin].
func (ob *Outbox) Stats(ctx context.Context) ([]outboxdriver.StateCount, error) {
	return countStates(ctx, ob.s, "outbox stats", ob.q.stats, outboxdriver.States())
}

// List implements [outboxdriver.Admin].
func (ob *Outbox) List(ctx context.Context, req outboxdriver.ListRequest) ([]outboxdriver.Row, error) {
	limit, err := outboxdriver.ListLimit(req)
	if err != nil {
		return nil, err
	}
	rows, err := ob.s.pool.Query(ctx, ob.q.list, string(req.State), req.AfterID, limit)
	return collectRows(ob.s, "outbox list", scanOutboxRow, rows, err)
}

// Get implements [outboxdriver.Admin].
func (ob *Outbox) Get(ctx context.Context, id int64) (outboxdriver.Row, error) {
	return ob.getOne(ctx, ob.q.get, id)
}

// GetByEventID implements [outboxdriver.Admin].
func (ob *Outbox) GetByEventID(ctx context.Context, eventID string) (outboxdriver.Row, error) {
	return ob.getOne(ctx, ob.q.getByEvent, eventID)
}

func (ob *Outbox) getOne(ctx context.Context, sql string, arg any) (outboxdriver.Row, error) {
	r, err := scanOutboxRow(ob.s.pool.QueryRow(ctx, sql, arg))
	if errors.Is(err, pgx.ErrNoRows) {
		return outboxdriver.Row{}, outboxdriver.NotFound("idempgx", fmt.Sprintf("%q", fmt.Sprint(arg)))
	}
	if err != nil {
		return outboxdriver.Row{}, ob.s.wrap("outbox get", err)
	}
	return r, nil
}

// Redrive implements [outboxdriver.Admin].
func (ob *Outbox) Redrive(ctx context.Context, sel outboxdriver.Select) (int64, error) {
	return ob.deadBatches(ctx, "outbox redrive", ob.q.redrive, sel)
}

// Discard implements [outboxdriver.Admin].
func (ob *Outbox) Discard(ctx context.Context, sel outboxdriver.Select) (int64, error) {
	return ob.deadBatches(ctx, "outbox discard", ob.q.discard, sel)
}

func (ob *Outbox) deadBatches(ctx context.Context, op, sql string, sel outboxdriver.Select) (int64, error) {
	if err := outboxdriver.ValidateSelect(sel); err != nil {
		return 0, err
	}
	return ob.s.deadBatches(ctx, op, sql, sel, min(ob.s.cfg.PurgeBatch, outboxdriver.MaxBatch))
}
