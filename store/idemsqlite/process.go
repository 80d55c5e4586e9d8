package idemsqlite

import (
	"context"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/storekit"
)

// MaxBatch bounds the messages of one ProcessBatch call, so that one
// statement's parameter stays a few megabytes at most.
const MaxBatch = 10000

// insertDedupe inserts the completed dedupe record, or replaces a record
// that is past its window (completed) or its lease (in progress, same
// fingerprint: a crashed Guard holder). The rows it changed (RETURNING for
// a batch) say which messages were fresh;
// the database, not Go, decides, so concurrent duplicates are serialised by
// the write lock and the primary key. Token 0: the transactional path holds
// no lease, and a later Claim still draws a higher token from the counter.
const insertDedupe = `INSERT INTO idem_records (` + recordColumns + `)
	%s
	ON CONFLICT (scope, key) DO UPDATE SET
		state = 'completed', fingerprint = excluded.fingerprint, result = NULL, failed = 0, tombstone = 0,
		created_at = excluded.created_at, lease_expires_at = NULL, completed_at = excluded.completed_at,
		expires_at = excluded.expires_at
	WHERE (idem_records.state = 'completed' AND idem_records.expires_at <= excluded.created_at)
	   OR (idem_records.state = 'in_progress' AND idem_records.lease_expires_at <= excluded.created_at
	       AND idem_records.fingerprint = excluded.fingerprint)`

var (
	// One message: the change count says whether it was fresh, which
	// spares the driver a result set (less CPU than RETURNING).
	insertOne = fmt.Sprintf(insertDedupe,
		`VALUES (?1, ?2, 'completed', ?3, 0, NULL, 0, 0, ?4, NULL, ?4, ?5)`)
	// The batch is one JSON array parameter: one statement however many
	// messages, no dynamic SQL. ORDER BY keeps the first occurrence of a
	// key inside the batch the one that is inserted.
	insertMany = fmt.Sprintf(insertDedupe,
		`SELECT json_extract(j.value, '$.s'), json_extract(j.value, '$.k'), 'completed',
		unhex(json_extract(j.value, '$.f')), 0, NULL, 0, 0, ?1, NULL, ?1, ?1 + json_extract(j.value, '$.r')
	FROM json_each(?2) AS j WHERE true ORDER BY j.key`) + `
	RETURNING scope, key`
)

// ProcessTx records msg as processed inside the caller's transaction tx and
// reports what the caller must do:
//
//   - Processed, nil: the message is new; apply its effect in tx and commit.
//     If tx rolls back, the dedupe record goes with it.
//   - Duplicate, nil: it was processed before (within its window); skip it.
//   - Mismatch, an error wrapping idem.ErrFingerprintMismatch: the key was
//     seen with different content; nothing was recorded.
//   - 0, an error wrapping idem.ErrInProgress: a Guard holds a live lease on
//     the key.
//
// Call it first in the transaction (see [New]). Opened with [Open], every
// transaction is BEGIN IMMEDIATE, so a concurrent duplicate waits for this
// one to commit and then sees the conflict.
func (s *Store) ProcessTx(ctx context.Context, tx *sql.Tx, msg idem.Message) (idem.Outcome, error) {
	if err := msg.Validate(); err != nil {
		return "", err
	}
	if tx == nil {
		return "", errors.New("idemsqlite: ProcessTx: nil *sql.Tx")
	}
	if err := s.checkOpen(); err != nil {
		return "", err
	}
	return s.processOne(ctx, tx, msg)
}

// processOne is ProcessTx over q: the caller's transaction, or (Process)
// the store's prepared statements on its own transaction, which spares
// parsing the insert on every call (a fifth of Process's CPU time,
// measured with BenchmarkProcessSideBySide).
func (s *Store) processOne(ctx context.Context, q execQueryRower, msg idem.Message) (idem.Outcome, error) {
	now := micros(s.now())
	res, err := q.ExecContext(ctx, insertOne, msg.Scope, msg.Key, msg.Fingerprint[:], now, now+msg.RetentionOrDefault().Microseconds())
	var n int64
	if err == nil {
		// An upsert counts the row it inserted or took over, not one it
		// left alone.
		n, err = res.RowsAffected()
	}
	if err != nil {
		return "", fmt.Errorf("idemsqlite: process: %w", classify(err))
	}
	if n > 0 {
		return idem.Processed, nil
	}
	rec, found, err := getRecord(ctx, q, msg.Scope, msg.Key)
	if err != nil {
		return "", err
	}
	if !found {
		// The row was not inserted and yet is gone: cannot happen inside one
		// write transaction; report it rather than guess.
		return "", fmt.Errorf("idemsqlite: process (scope %q, key %q): conflicting record vanished", msg.Scope, msg.Key)
	}
	return judge(rec, msg)
}

// execQueryRower is a *sql.Tx or a hotQuerier.
type execQueryRower interface {
	queryRower
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// judge says what an existing record means for msg. The insert took over
// every record that counts as absent, in the same write transaction, so
// the one it left is unexpired and, in progress, held.
func judge(rec idem.Record, msg idem.Message) (idem.Outcome, error) {
	out, retry, err := storekit.Judge(existing(rec), msg)
	if retry {
		return "", fmt.Errorf("idemsqlite: process (scope %q, key %q): the record it did not take over counts as absent", msg.Scope, msg.Key)
	}
	return out, err
}

func existing(rec idem.Record) storekit.Existing {
	return storekit.Existing{State: rec.State, Fingerprint: rec.Fingerprint, Live: rec.State == idem.StateInProgress}
}

// Process runs fn for msg at most once: the dedupe record and fn's effect
// commit together in one transaction, or neither does. It returns Processed
// when fn ran and committed, Duplicate (fn did not run) or Mismatch with
// an error wrapping idem.ErrFingerprintMismatch. When fn fails, everything
// rolls back and Process returns 0 and fn's error wrapped, so a redelivery
// runs fn again. A panic in fn rolls its message back and reaches the
// caller.
//
// Concurrent calls share a transaction and its commit (group commit, one
// fsync for up to 256 writes, with the claims and lease holders' writes
// queued at the same time): each message runs in a SAVEPOINT of its own,
// with fn called on the caller's goroutine with the caller's ctx, one
// message at a time, and a failing or panicking fn rolls back only its own
// message. Process returns only after the shared commit; when it fails,
// every message in it fails with that error, and nothing of them was
// recorded. fn must therefore leave tx open: it must not call tx.Commit or
// tx.Rollback, nor run COMMIT, ROLLBACK or RELEASE of a savepoint it did
// not create. A statement of fn interrupted by ctx ends the whole
// transaction in SQLite; every message sharing it then fails with an error
// wrapping idem.ErrCommitUnknown (redeliver it: the dedupe record decides).
func (s *Store) Process(ctx context.Context, msg idem.Message, fn func(ctx context.Context, tx *sql.Tx) error) (idem.Outcome, error) {
	if err := msg.Validate(); err != nil {
		return "", err
	}
	if s.writes.idle() {
		// Nobody writes or waits: there is nobody to share a transaction
		// with, so spare the hand-overs and the savepoint. (Should another
		// write take the lock first, this one waits for it like any other
		// write: correct, only not shared.)
		return s.processAlone(ctx, msg, fn)
	}
	m := &processMember{s: s, ctx: ctx, msg: msg, fn: fn, turn: make(chan *sql.Tx), back: make(chan error)}
	done := make(chan error, 1)
	// The write queue's leader (this call's helper goroutine or another
	// call's) runs the shared transaction and, when m's turn comes, hands
	// it over through m.share; m.take then runs on this goroutine, the
	// caller's, so that fn sees the caller's goroutine and its panics
	// reach the caller.
	go func() { done <- s.inSharedTx(ctx, "process", false, m.share) }()
	for {
		select {
		case tx := <-m.turn:
			m.take(tx)
		case err := <-done:
			if err != nil && err != errRollback {
				// Never run (ctx ended in the queue, the store closed), or
				// the shared transaction failed: its commit (nothing of m
				// was recorded), or it ended under a handler (the error
				// wraps idem.ErrCommitUnknown).
				return "", err
			}
			return m.res, m.err
		}
	}
}

// processAlone is Process in a transaction of its own.
func (s *Store) processAlone(ctx context.Context, msg idem.Message, fn func(ctx context.Context, tx *sql.Tx) error) (idem.Outcome, error) {
	var res idem.Outcome
	err := s.inTx(ctx, "process", func(tx *sql.Tx, _ int64) error {
		var err error
		res, err = s.processOne(ctx, s.hot(tx), msg)
		if err != nil {
			return err
		}
		if res != idem.Processed {
			return errRollback
		}
		if err := fn(ctx, tx); err != nil {
			res = ""
			return fmt.Errorf("idemsqlite: process (scope %q, key %q): handler: %w", msg.Scope, msg.Key, err)
		}
		return nil
	})
	if errors.Is(err, errRollback) {
		err = nil
	}
	if err != nil && res == idem.Processed {
		// The commit failed: nothing was recorded.
		res = ""
	}
	return res, err
}

// processMember is one Process call in a shared transaction.
type processMember struct {
	s    *Store
	ctx  context.Context
	msg  idem.Message
	fn   func(ctx context.Context, tx *sql.Tx) error
	turn chan *sql.Tx // the leader hands over the transaction
	back chan error   // and gets it back with take's verdict
	res  idem.Outcome
	err  error
}

// share is m's write in the shared transaction, called by its leader:
// it hands tx to m's goroutine and waits for it to be done with it.
func (m *processMember) share(_ context.Context, tx *sql.Tx, _ int64) error {
	m.turn <- tx
	return <-m.back
}

// The savepoint each message of a shared transaction runs in; messages
// run one after another, so one name does.
const (
	savepoint         = "SAVEPOINT idem_process"
	releaseSavepoint  = "RELEASE idem_process"
	rollbackSavepoint = "ROLLBACK TO idem_process"
)

// take runs m's message in tx, inside its savepoint, and hands tx back
// with its verdict for the shared transaction: nil to keep m's part (it
// waits for the commit: Processed, or an outcome read from rows the
// commit may still lose), errRollback when m's part was rolled back to its
// savepoint and nothing of it is left, any other error when tx cannot be
// used any more (every message in it then fails with that error). A
// panic (or runtime.Goexit) in fn rolls m's part back and then goes on.
func (m *processMember) take(tx *sql.Tx) {
	q := m.s.hot(tx)
	// The store's own statements are not interrupted by ctx: in SQLite an
	// interrupted write rolls back the whole transaction, the other
	// messages' parts with it.
	sctx := context.WithoutCancel(m.ctx)
	verdict, settled := error(nil), false
	defer func() {
		if !settled {
			m.res, m.err = "", fmt.Errorf("idemsqlite: process (scope %q, key %q): the handler panicked", m.msg.Scope, m.msg.Key)
			verdict = m.undo(sctx, q, errRollback)
		}
		m.back <- verdict
	}()
	if _, err := q.ExecContext(sctx, savepoint); err != nil {
		settled, verdict = true, m.broken(err)
		return
	}
	m.res, m.err = m.s.processOne(sctx, q, m.msg)
	switch {
	case m.res == idem.Processed:
		if err := m.fn(m.ctx, tx); err != nil {
			m.res, m.err = "", fmt.Errorf("idemsqlite: process (scope %q, key %q): handler: %w", m.msg.Scope, m.msg.Key, err)
			settled, verdict = true, m.undo(sctx, q, errRollback)
			return
		}
	case m.err != nil && m.res != idem.Mismatch && !errors.Is(m.err, idem.ErrInProgress):
		// The insert failed; its statement rolled back, maybe more.
		settled, verdict = true, m.undo(sctx, q, errRollback)
		return
	}
	settled = true
	if _, err := q.ExecContext(sctx, releaseSavepoint); err != nil {
		verdict = m.broken(err)
	}
}

// undo rolls m's part back to its savepoint and releases it, and returns
// ok, or the error that says the transaction is gone.
func (m *processMember) undo(ctx context.Context, q hotQuerier, ok error) error {
	if _, err := q.ExecContext(ctx, rollbackSavepoint); err != nil {
		return m.broken(err)
	}
	if _, err := q.ExecContext(ctx, releaseSavepoint); err != nil {
		return m.broken(err)
	}
	return ok
}

// broken is the error of a shared transaction that ended under m: an
// interrupted statement, a disk error, or fn ending tx, rolled it back or
// committed it, which the store cannot tell apart.
func (m *processMember) broken(err error) error {
	return fmt.Errorf("idemsqlite: process (scope %q, key %q): the shared transaction ended under this message (an interrupted statement rolls it back; fn must not end it): %w: %w",
		m.msg.Scope, m.msg.Key, idem.ErrCommitUnknown, classify(err))
}

type batchItem struct {
	S string `json:"s"`
	K string `json:"k"`
	F string `json:"f"`
	R int64  `json:"r"`
}

type scopeKey struct{ scope, key string }

// ProcessBatchTx records a batch of messages in the caller's transaction
// with one INSERT and returns one result per message: Processed for the
// fresh ones (apply their effects in tx), Duplicate for those seen before or
// repeated inside the batch (the first occurrence is the fresh one), and
// Mismatch for keys seen with different content (nothing recorded for
// them; the error is nil, the result says it). A key held by a live Guard
// lease fails the whole call with an error wrapping idem.ErrInProgress:
// roll tx back and retry later.
func (s *Store) ProcessBatchTx(ctx context.Context, tx *sql.Tx, msgs []idem.Message) ([]idem.Outcome, error) {
	if err := storekit.ValidateBatch(msgs, MaxBatch, idem.Message.Validate); err != nil {
		return nil, fmt.Errorf("idemsqlite: %w", err)
	}
	items := make([]batchItem, len(msgs))
	for i, m := range msgs {
		items[i] = batchItem{S: m.Scope, K: m.Key, F: hex.EncodeToString(m.Fingerprint[:]), R: m.RetentionOrDefault().Microseconds()}
	}
	if tx == nil {
		return nil, errors.New("idemsqlite: ProcessBatchTx: nil *sql.Tx")
	}
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	results := make([]idem.Outcome, len(msgs))
	if len(msgs) == 0 {
		return results, nil
	}
	param, err := json.Marshal(items)
	if err != nil {
		return nil, fmt.Errorf("idemsqlite: process batch: %w", err)
	}
	rows, err := tx.QueryContext(ctx, insertMany, micros(s.now()), string(param))
	if err != nil {
		return nil, fmt.Errorf("idemsqlite: process batch: %w", classify(err))
	}
	fresh := make(map[scopeKey]bool, len(msgs))
	for rows.Next() {
		var k scopeKey
		if err := rows.Scan(&k.scope, &k.key); err != nil {
			_ = rows.Close()
			return nil, fmt.Errorf("idemsqlite: process batch: %w", classify(err))
		}
		fresh[k] = true
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, fmt.Errorf("idemsqlite: process batch: %w", classify(err))
	}
	first := storekit.Firsts(msgs)
	stored := make(map[int]storekit.Existing)
	for i, m := range msgs {
		if first[i] != i {
			continue
		}
		if fresh[scopeKey{m.Scope, m.Key}] {
			results[i] = idem.Processed
			continue
		}
		rec, found, err := getRecord(ctx, tx, m.Scope, m.Key)
		if err != nil {
			return nil, err
		}
		if !found {
			return nil, fmt.Errorf("idemsqlite: process batch (scope %q, key %q): conflicting record vanished", m.Scope, m.Key)
		}
		stored[i] = existing(rec)
		res, err := judge(rec, m)
		if res != idem.Mismatch && err != nil {
			return nil, err
		}
		results[i] = res
	}
	if err := storekit.SettleRepeats(msgs, first, results, func(j int) (storekit.Existing, bool) {
		e, ok := stored[j]
		return e, ok
	}); err != nil {
		return nil, fmt.Errorf("idemsqlite: process batch: %w", err)
	}
	return results, nil
}

// ProcessBatch runs fn once for the fresh messages of msgs (fresh holds
// their indexes into msgs, in order) in one transaction with their dedupe
// records: one round trip for the whole batch, which is where the
// throughput comes from. fn is not called when nothing is fresh. When fn
// fails, everything rolls back and ProcessBatch returns nil results and
// fn's error wrapped, so the whole batch can be redelivered.
func (s *Store) ProcessBatch(ctx context.Context, msgs []idem.Message, fn func(ctx context.Context, tx *sql.Tx, fresh []int) error) ([]idem.Outcome, error) {
	var results []idem.Outcome
	err := s.inTx(ctx, "process batch", func(tx *sql.Tx, _ int64) error {
		var err error
		results, err = s.ProcessBatchTx(ctx, tx, msgs)
		if err != nil {
			return err
		}
		var fresh []int
		for i, r := range results {
			if r == idem.Processed {
				fresh = append(fresh, i)
			}
		}
		if len(fresh) == 0 {
			return errRollback
		}
		if err := fn(ctx, tx, fresh); err != nil {
			return fmt.Errorf("idemsqlite: process batch: handler: %w", err)
		}
		return nil
	})
	if errors.Is(err, errRollback) {
		err = nil
	}
	if err != nil {
		return nil, err
	}
	return results, nil
}
