package idemmysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/storekit"
)

var (
	_ idem.StepStore            = (*Store)(nil)
	_ idem.StepTxStore[*sql.Tx] = (*Store)(nil)
)

const stepColumns = "scope, `key`, name, seq, fingerprint, token, result, tombstone, created_at, expires_at"

// RecordStep implements idem.StepStore: one READ COMMITTED transaction, on
// a connection the gate leaves to lease holders, locks the record row of
// req.Token, drops the operation's expired steps and inserts the step.
func (s *Store) RecordStep(ctx context.Context, req idem.StepRequest) (idem.StepRecord, error) {
	if err := idem.ValidateStep(req); err != nil {
		return idem.StepRecord{}, err
	}
	var rec idem.StepRecord
	err := s.inTx(ctx, "record step", func(tx *sql.Tx) (bool, error) {
		var err error
		rec, err = s.writeStep(ctx, tx, req)
		return err == nil, err
	})
	if err != nil {
		return idem.StepRecord{}, err
	}
	return rec, nil
}

// DoStepTx implements idem.StepTxStore: fn runs in a READ COMMITTED
// transaction, then the step is written in it as RecordStep writes it, and
// both commit together. A COMMIT whose answer was lost returns an error
// wrapping idem.ErrCommitUnknown: read the steps to find out.
func (s *Store) DoStepTx(ctx context.Context, req idem.StepRequest, fn func(ctx context.Context, tx *sql.Tx) ([]byte, error)) (idem.StepRecord, error) {
	req.Result, req.Tombstone = nil, false
	if err := idem.ValidateStep(req); err != nil {
		return idem.StepRecord{}, err
	}
	var rec idem.StepRecord
	err := s.gated(ctx, "step", func() error {
		return s.inTx(ctx, "step", func(tx *sql.Tx) (bool, error) {
			val, err := fn(ctx, tx)
			if req, err = storekit.StepResult("idemmysql", req, val, err); err != nil {
				return false, err
			}
			rec, err = s.writeStep(ctx, tx, req)
			return err == nil, err
		})
	})
	if err != nil {
		return idem.StepRecord{}, err
	}
	return rec, nil
}

// writeStep records req in tx (see idem.StepStore.RecordStep). The lock
// on the record row makes step writes of one operation take turns (Seq
// and the count are read after it) and makes a claim that takes the lease
// over wait for a step write in flight.
func (s *Store) writeStep(ctx context.Context, tx *sql.Tx, req idem.StepRequest) (idem.StepRecord, error) {
	var fp []byte
	err := tx.QueryRowContext(ctx, "SELECT fingerprint FROM idem_records WHERE scope = ? AND `key` = ? AND token = ? AND state = 'in_progress' FOR UPDATE",
		req.Scope, req.Key, req.Token).Scan(&fp)
	if errors.Is(err, sql.ErrNoRows) {
		return idem.StepRecord{}, fmt.Errorf("%w: idemmysql: record step %q (scope %q, key %q): token %d is not the current lease",
			idem.ErrLeaseLost, req.Name, req.Scope, req.Key, req.Token)
	}
	if err != nil {
		return idem.StepRecord{}, s.wrap("record step", err)
	}
	const op = " WHERE scope = ? AND `key` = ?"
	if _, err := tx.ExecContext(ctx, "DELETE FROM idem_steps"+op+" AND expires_at <= "+nowSQL, req.Scope, req.Key); err != nil {
		return idem.StepRecord{}, s.wrap("record step", err)
	}
	var st storekit.StepStats
	if err := tx.QueryRowContext(ctx, "SELECT COUNT(*), COALESCE(MAX(seq), 0), COALESCE(SUM(name = ?), 0) > 0, COALESCE(SUM(fingerprint <> ?), 0) > 0 FROM idem_steps"+op,
		req.Name, fp, req.Scope, req.Key).Scan(&st.Count, &st.MaxSeq, &st.Recorded, &st.OtherPayload); err != nil {
		return idem.StepRecord{}, s.wrap("record step", err)
	}
	rec, err := storekit.NewStep(req, fp, st)
	if err != nil {
		return idem.StepRecord{}, err
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO idem_steps ("+stepColumns+") VALUES (?, ?, ?, ?, ?, ?, ?, ?, "+nowSQL+", "+nowSQL+" + INTERVAL ? MICROSECOND)",
		rec.Scope, rec.Key, rec.Name, rec.Seq, fp, rec.Token, rec.Result, rec.Tombstone, micros(req.Retention)); err != nil {
		return idem.StepRecord{}, s.wrap("record step", err)
	}
	var created, expires dbTime
	if err := tx.QueryRowContext(ctx, "SELECT created_at, expires_at FROM idem_steps"+op+" AND name = ?", req.Scope, req.Key, req.Name).Scan(&created, &expires); err != nil {
		return idem.StepRecord{}, s.wrap("record step", err)
	}
	rec.CreatedAt, rec.ExpiresAt = created.time(), expires.time()
	if _, err := tx.ExecContext(ctx, "UPDATE idem_steps SET expires_at = ?"+op, dt(rec.ExpiresAt), req.Scope, req.Key); err != nil {
		return idem.StepRecord{}, s.wrap("record step", err)
	}
	return rec, nil
}

// Steps implements idem.StepStore.
func (s *Store) Steps(ctx context.Context, scope, key string) ([]idem.StepRecord, error) {
	if err := idem.Validate(scope, key); err != nil {
		return nil, err
	}
	out := []idem.StepRecord{}
	err := s.gated(ctx, "steps", func() error {
		rows, err := s.db.QueryContext(ctx, "SELECT "+stepColumns+" FROM idem_steps WHERE scope = ? AND `key` = ? AND expires_at > "+nowSQL+" ORDER BY seq", scope, key)
		if err != nil {
			return s.wrap("steps", err)
		}
		return eachRow(rows, func(rows *sql.Rows) error {
			var (
				r                idem.StepRecord
				sc, k, name, fp  []byte
				created, expires dbTime
			)
			if err := rows.Scan(&sc, &k, &name, &r.Seq, &fp, &r.Token, &r.Result, &r.Tombstone, &created, &expires); err != nil {
				return s.wrap("steps", err)
			}
			if len(fp) != len(r.Fingerprint) {
				return fmt.Errorf("idemmysql: step %q of (%q, %q) has a %d-byte fingerprint", name, scope, key, len(fp))
			}
			r.Scope, r.Key, r.Name = string(sc), string(k), string(name)
			copy(r.Fingerprint[:], fp)
			if !r.Tombstone && r.Result == nil {
				r.Result = []byte{}
			}
			r.CreatedAt, r.ExpiresAt = created.time(), expires.time()
			out = append(out, r)
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// purgeSteps deletes expired steps in batches of at most limit rows, each
// a short transaction of its own. Purge calls it after the records; its
// count is not part of Purge's, which counts records.
func (s *Store) purgeSteps(ctx context.Context, limit int) error {
	_, err := s.batches(ctx, "purge steps", limit, func(tx *sql.Tx) (int64, error) {
		res, err := tx.ExecContext(ctx, "DELETE FROM idem_steps WHERE expires_at <= "+nowSQL+" ORDER BY expires_at LIMIT ?", limit)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	})
	return err
}
