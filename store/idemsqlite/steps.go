package idemsqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/storekit"
)

var (
	_ idem.StepStore            = (*Store)(nil)
	_ idem.StepTxStore[*sql.Tx] = (*Store)(nil)
)

const stepColumns = `scope, key, name, seq, fingerprint, token, result, tombstone, created_at, expires_at`

// RecordStep implements idem.StepStore: one write transaction, ahead of
// the claims in the write queue as the lease holders' writes are, that
// checks the token, drops the operation's expired steps and inserts the
// step.
func (s *Store) RecordStep(ctx context.Context, req idem.StepRequest) (idem.StepRecord, error) {
	if err := idem.ValidateStep(req); err != nil {
		return idem.StepRecord{}, err
	}
	var rec idem.StepRecord
	err := s.runTx(ctx, "record step", true, func(tx *sql.Tx, now int64) error {
		var err error
		rec, err = writeStep(ctx, tx, req, now)
		return err
	})
	if err != nil {
		return idem.StepRecord{}, err
	}
	return rec, nil
}

// DoStepTx implements idem.StepTxStore: fn's effect and the step record
// commit in one write transaction, so the effect commits only if the lease
// is current and the step was not recorded yet. The transaction holds the
// store's write lock while fn runs (SQLite has one writer): fn must use tx
// only, never the store or its *sql.DB, and should be short.
func (s *Store) DoStepTx(ctx context.Context, req idem.StepRequest, fn func(ctx context.Context, tx *sql.Tx) ([]byte, error)) (idem.StepRecord, error) {
	req.Result, req.Tombstone = nil, false
	if err := idem.ValidateStep(req); err != nil {
		return idem.StepRecord{}, err
	}
	var rec idem.StepRecord
	err := s.runTx(ctx, "step", true, func(tx *sql.Tx, now int64) error {
		// Fenced first, so a lost lease costs no effect; the record row is
		// then stable until the commit (one writer at a time).
		if _, err := heldFingerprint(ctx, tx, req); err != nil {
			return err
		}
		val, err := fn(ctx, tx)
		if req, err = storekit.StepResult("idemsqlite", req, val, err); err != nil {
			return err
		}
		rec, err = writeStep(ctx, tx, req, now)
		return err
	})
	if err != nil {
		return idem.StepRecord{}, err
	}
	return rec, nil
}

// heldFingerprint returns the fingerprint of the record req's token holds,
// or an error wrapping idem.ErrLeaseLost.
func heldFingerprint(ctx context.Context, tx *sql.Tx, req idem.StepRequest) ([]byte, error) {
	var fp []byte
	err := tx.QueryRowContext(ctx, `SELECT fingerprint FROM idem_records
	WHERE scope = ? AND key = ? AND token = ? AND state = 'in_progress'`, req.Scope, req.Key, req.Token).Scan(&fp)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("%w: idemsqlite: record step %q (scope %q, key %q): token %d is not the current lease", idem.ErrLeaseLost, req.Name, req.Scope, req.Key, req.Token)
	}
	if err != nil {
		return nil, fmt.Errorf("idemsqlite: record step: %w", classify(err))
	}
	return fp, nil
}

// writeStep records req in tx at time now (see idem.StepStore.RecordStep).
func writeStep(ctx context.Context, tx *sql.Tx, req idem.StepRequest, now int64) (idem.StepRecord, error) {
	fp, err := heldFingerprint(ctx, tx, req)
	if err != nil {
		return idem.StepRecord{}, err
	}
	wrap := func(err error) error { return fmt.Errorf("idemsqlite: record step: %w", classify(err)) }
	if _, err := tx.ExecContext(ctx, "DELETE FROM idem_steps WHERE scope = ? AND key = ? AND expires_at <= ?", req.Scope, req.Key, now); err != nil {
		return idem.StepRecord{}, wrap(err)
	}
	var st storekit.StepStats
	if err := tx.QueryRowContext(ctx, `SELECT count(*), coalesce(max(seq), 0), coalesce(sum(name = ?), 0) > 0, coalesce(sum(fingerprint <> ?), 0) > 0
	FROM idem_steps WHERE scope = ? AND key = ?`, req.Name, fp, req.Scope, req.Key).Scan(&st.Count, &st.MaxSeq, &st.Recorded, &st.OtherPayload); err != nil {
		return idem.StepRecord{}, wrap(err)
	}
	rec, err := storekit.NewStep(req, fp, st)
	if err != nil {
		return idem.StepRecord{}, err
	}
	rec.CreatedAt, rec.ExpiresAt = time.UnixMicro(now), time.UnixMicro(now+req.Retention.Microseconds())
	if _, err := tx.ExecContext(ctx, `INSERT INTO idem_steps (`+stepColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		rec.Scope, rec.Key, rec.Name, rec.Seq, fp, rec.Token, rec.Result, rec.Tombstone, now, micros(rec.ExpiresAt)); err != nil {
		return idem.StepRecord{}, wrap(err)
	}
	if _, err := tx.ExecContext(ctx, "UPDATE idem_steps SET expires_at = ? WHERE scope = ? AND key = ?",
		micros(rec.ExpiresAt), req.Scope, req.Key); err != nil {
		return idem.StepRecord{}, wrap(err)
	}
	return rec, nil
}

// Steps implements idem.StepStore.
func (s *Store) Steps(ctx context.Context, scope, key string) ([]idem.StepRecord, error) {
	if err := idem.Validate(scope, key); err != nil {
		return nil, err
	}
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	rows, err := s.db.QueryContext(ctx, "SELECT "+stepColumns+" FROM idem_steps WHERE scope = ? AND key = ? AND expires_at > ? ORDER BY seq",
		scope, key, micros(s.now()))
	if err != nil {
		return nil, fmt.Errorf("idemsqlite: steps: %w", classify(err))
	}
	defer rows.Close()
	out := []idem.StepRecord{}
	for rows.Next() {
		var (
			r                idem.StepRecord
			fp               []byte
			created, expires int64
		)
		if err := rows.Scan(&r.Scope, &r.Key, &r.Name, &r.Seq, &fp, &r.Token, &r.Result, &r.Tombstone, &created, &expires); err != nil {
			return nil, fmt.Errorf("idemsqlite: steps: %w", classify(err))
		}
		if len(fp) != len(r.Fingerprint) {
			return nil, fmt.Errorf("idemsqlite: step %q of (%q, %q) has a %d-byte fingerprint", r.Name, scope, key, len(fp))
		}
		copy(r.Fingerprint[:], fp)
		if !r.Tombstone && r.Result == nil {
			r.Result = []byte{}
		}
		r.CreatedAt, r.ExpiresAt = time.UnixMicro(created), time.UnixMicro(expires)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("idemsqlite: steps: %w", classify(err))
	}
	return out, nil
}

// deleteSteps removes the steps of (scope, key) inside Delete's
// transaction and returns how many there were.
func deleteSteps(ctx context.Context, tx *sql.Tx, scope, key string) (int64, error) {
	res, err := tx.ExecContext(ctx, "DELETE FROM idem_steps WHERE scope = ? AND key = ?", scope, key)
	if err != nil {
		return 0, fmt.Errorf("idemsqlite: delete steps: %w", classify(err))
	}
	return res.RowsAffected()
}

// purgeSteps deletes expired steps in batches of at most limit rows, each
// in a transaction of its own. Purge calls it after the records; its count
// is not part of Purge's, which counts records.
func (s *Store) purgeSteps(ctx context.Context, limit int) error {
	_, err := s.inBatches(ctx, "purge steps", limit, func(tx *sql.Tx, now int64) (sql.Result, error) {
		res, err := tx.ExecContext(ctx, `DELETE FROM idem_steps WHERE (scope, key, name) IN (
	SELECT scope, key, name FROM idem_steps WHERE expires_at <= ? LIMIT ?)`, now, limit)
		if err != nil {
			return nil, fmt.Errorf("idemsqlite: purge steps: %w", classify(err))
		}
		return res, nil
	})
	return err
}
