package idempgx

import (
	"context"
	"errors"
	"fmt"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/storekit"
	"github.com/jackc/pgx/v5"
)

var (
	_ idem.StepStore           = (*Store)(nil)
	_ idem.StepTxStore[pgx.Tx] = (*Store)(nil)
)

// stepQueries are the steps' statements over the schema's tables.
type stepQueries struct {
	lock, dropExpired, stats, insert, touch, list, deleteAll, purge string
}

func newStepQueries(schema string) stepQueries {
	r := pgx.Identifier{schema, "idem_records"}.Sanitize()
	t := pgx.Identifier{schema, "idem_steps"}.Sanitize()
	return stepQueries{
		// FOR UPDATE: step writes of one operation take turns (Seq and the
		// count are read after the lock), and a claim that takes the lease
		// over waits for a step write in flight, so the new holder reads
		// every step that committed under the old token.
		lock: `SELECT fingerprint FROM ` + r + `
	WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_progress' FOR UPDATE`,
		dropExpired: `DELETE FROM ` + t + ` WHERE scope = $1 AND key = $2 AND expires_at <= now()`,
		stats: `SELECT count(*), coalesce(max(seq), 0), bool_or(name = $3) IS TRUE, bool_or(fingerprint <> $4) IS TRUE
	FROM ` + t + ` WHERE scope = $1 AND key = $2`,
		insert: `INSERT INTO ` + t + ` (scope, key, name, seq, fingerprint, token, result, tombstone, created_at, expires_at)
	VALUES ($1, $2, $3, $4, $5, $6, $7, $8, now(), now() + $9 * interval '1 microsecond')
	RETURNING created_at, expires_at`,
		touch: `UPDATE ` + t + ` SET expires_at = $3 WHERE scope = $1 AND key = $2 AND expires_at <> $3`,
		list: `SELECT scope, key, name, seq, fingerprint, token, result, tombstone, created_at, expires_at
	FROM ` + t + ` WHERE scope = $1 AND key = $2 AND expires_at > now() ORDER BY seq`,
		deleteAll: `DELETE FROM ` + t + ` WHERE scope = $1 AND key = $2`,
		purge: `DELETE FROM ` + t + ` WHERE ctid = ANY(ARRAY(
	SELECT ctid FROM ` + t + ` WHERE expires_at <= now() LIMIT $1 FOR UPDATE SKIP LOCKED))`,
	}
}

// RecordStep implements idem.StepStore: one transaction on a lease
// holder's connection locks the record row of req.Token, drops the
// operation's expired steps and inserts the step.
func (s *Store) RecordStep(ctx context.Context, req idem.StepRequest) (idem.StepRecord, error) {
	if err := idem.ValidateStep(req); err != nil {
		return idem.StepRecord{}, err
	}
	conn, err := s.conn(ctx, "record step", true)
	if err != nil {
		return idem.StepRecord{}, err
	}
	defer s.done(conn, true)
	tx, err := conn.Begin(ctx)
	if err != nil {
		return idem.StepRecord{}, s.wrap("record step: begin", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	rec, err := s.writeStep(ctx, tx, req)
	if err != nil {
		return idem.StepRecord{}, err
	}
	if err := tx.Commit(ctx); err != nil {
		return idem.StepRecord{}, s.commitError("record step", err)
	}
	return rec, nil
}

// DoStepTx implements idem.StepTxStore: fn runs in a transaction from the
// pool, then the step is written in it as RecordStep writes it, and both
// commit together. A COMMIT whose answer was lost returns an error
// wrapping idem.ErrCommitUnknown: read the steps to find out.
func (s *Store) DoStepTx(ctx context.Context, req idem.StepRequest, fn func(ctx context.Context, tx pgx.Tx) ([]byte, error)) (idem.StepRecord, error) {
	req.Result, req.Tombstone = nil, false
	if err := idem.ValidateStep(req); err != nil {
		return idem.StepRecord{}, err
	}
	var rec idem.StepRecord
	err := s.inTx(ctx, "step", func(tx pgx.Tx) (bool, error) {
		val, err := fn(ctx, tx)
		if req, err = storekit.StepResult("idempgx", req, val, err); err != nil {
			return false, err
		}
		rec, err = s.writeStep(ctx, tx, req)
		return err == nil, err
	})
	if err != nil {
		return idem.StepRecord{}, err
	}
	return rec, nil
}

// writeStep records req in tx (see idem.StepStore.RecordStep).
func (s *Store) writeStep(ctx context.Context, tx pgx.Tx, req idem.StepRequest) (idem.StepRecord, error) {
	q := s.sq
	var fp []byte
	err := tx.QueryRow(ctx, q.lock, req.Scope, req.Key, req.Token).Scan(&fp)
	if errors.Is(err, pgx.ErrNoRows) {
		return idem.StepRecord{}, fmt.Errorf("%w: idempgx: record step %q (scope %q, key %q): token %d is not the current lease",
			idem.ErrLeaseLost, req.Name, req.Scope, req.Key, req.Token)
	}
	if err != nil {
		return idem.StepRecord{}, s.wrap("record step", err)
	}
	if _, err := tx.Exec(ctx, q.dropExpired, req.Scope, req.Key); err != nil {
		return idem.StepRecord{}, s.wrap("record step", err)
	}
	var st storekit.StepStats
	if err := tx.QueryRow(ctx, q.stats, req.Scope, req.Key, req.Name, fp).Scan(&st.Count, &st.MaxSeq, &st.Recorded, &st.OtherPayload); err != nil {
		return idem.StepRecord{}, s.wrap("record step", err)
	}
	rec, err := storekit.NewStep(req, fp, st)
	if err != nil {
		return idem.StepRecord{}, err
	}
	if err := tx.QueryRow(ctx, q.insert, rec.Scope, rec.Key, rec.Name, rec.Seq, fp, rec.Token, rec.Result, rec.Tombstone,
		micros(req.Retention)).Scan(&rec.CreatedAt, &rec.ExpiresAt); err != nil {
		return idem.StepRecord{}, s.wrap("record step", err)
	}
	if _, err := tx.Exec(ctx, q.touch, req.Scope, req.Key, rec.ExpiresAt); err != nil {
		return idem.StepRecord{}, s.wrap("record step", err)
	}
	return rec, nil
}

// Steps implements idem.StepStore.
func (s *Store) Steps(ctx context.Context, scope, key string) ([]idem.StepRecord, error) {
	if err := idem.Validate(scope, key); err != nil {
		return nil, err
	}
	conn, err := s.conn(ctx, "steps", false)
	if err != nil {
		return nil, err
	}
	defer s.done(conn, false)
	rows, err := conn.Query(ctx, s.sq.list, scope, key)
	if err != nil {
		return nil, s.wrap("steps", err)
	}
	out := []idem.StepRecord{}
	for rows.Next() {
		var (
			r  idem.StepRecord
			fp []byte
		)
		if err := rows.Scan(&r.Scope, &r.Key, &r.Name, &r.Seq, &fp, &r.Token, &r.Result, &r.Tombstone, &r.CreatedAt, &r.ExpiresAt); err != nil {
			rows.Close()
			return nil, s.wrap("steps", err)
		}
		if len(fp) != len(r.Fingerprint) {
			rows.Close()
			return nil, fmt.Errorf("idempgx: step %q of (%q, %q) has a %d-byte fingerprint", r.Name, scope, key, len(fp))
		}
		copy(r.Fingerprint[:], fp)
		if !r.Tombstone && r.Result == nil {
			r.Result = []byte{}
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, s.wrap("steps", err)
	}
	return out, nil
}

// purgeSteps deletes expired steps in batches of at most limit rows, each
// one autocommit statement. Purge calls it after the records; its count is
// not part of Purge's, which counts records.
func (s *Store) purgeSteps(ctx context.Context, limit int) error {
	for {
		conn, err := s.conn(ctx, "purge steps", false)
		if err != nil {
			return err
		}
		tag, err := conn.Exec(ctx, s.sq.purge, limit)
		s.done(conn, false)
		if err != nil {
			return s.wrap("purge steps", err)
		}
		if tag.RowsAffected() < int64(limit) {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("idempgx: purge steps: %w", err)
		}
	}
}
