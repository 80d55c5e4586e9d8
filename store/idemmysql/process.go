package idemmysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/storekit"
)

// Process runs fn at most once per message, in one transaction with the
// message's dedupe record: the record and fn's effect commit together or
// not at all.
//
//   - A new message (or one whose dedupe window passed): fn runs with the
//     transaction; if it returns nil the transaction commits and Process
//     returns idem.Processed. If it returns an error, everything rolls back,
//     nothing is recorded and the error is returned wrapped, so a redelivery
//     runs fn again.
//   - A message seen before with the same fingerprint: fn does not run;
//     idem.Duplicate and a nil error.
//   - A key seen before with another fingerprint: fn does not run;
//     idem.Mismatch and an error wrapping idem.ErrFingerprintMismatch.
//   - A key held by a live Guard lease: an error wrapping idem.ErrInProgress.
//
// The transaction is READ COMMITTED. A concurrent duplicate waits on the
// unique key until the first transaction ends, then sees its outcome. A
// deadlock before fn ran (two transactions taking the same expired record
// over) runs the attempt again; fn never runs twice. Infrastructure failures are marked with
// idem.Retryable; a commit whose answer was lost also wraps
// idem.ErrCommitUnknown. Retrying is always safe because a committed
// message is then a Duplicate.
func (s *Store) Process(ctx context.Context, msg idem.Message, fn func(ctx context.Context, tx *sql.Tx) error) (idem.Outcome, error) {
	if err := msg.Validate(); err != nil {
		return "", err
	}
	if fn == nil {
		return "", fmt.Errorf("%w: nil handler", idem.ErrInvalidConfig)
	}
	var (
		res idem.Outcome
		ran bool
	)
	err := retryDeadlocks(ctx, &ran, func() error {
		return s.inTx(ctx, fmt.Sprintf("process %q", msg.Key), func(tx *sql.Tx) (bool, error) {
			var err error
			res, err = s.ProcessTx(ctx, tx, msg)
			if err != nil || res != idem.Processed {
				return false, err
			}
			ran = true
			if err := fn(ctx, tx); err != nil {
				res = ""
				return false, fmt.Errorf("idemmysql: process %q: handler: %w", msg.Key, classify(err))
			}
			return true, nil
		})
	})
	if err != nil {
		if res == idem.Mismatch {
			return res, err
		}
		return "", err
	}
	return res, nil
}

// ProcessTx records msg's dedupe row in the caller's transaction tx and
// reports what to do:
//
//   - idem.Processed: the message is new; apply its effect in tx and commit.
//     If tx rolls back, nothing was recorded.
//   - idem.Duplicate: seen before; skip the effect (nil error).
//   - idem.Mismatch: the key was used for other content; the error wraps
//     idem.ErrFingerprintMismatch.
//
// It inserts the row without ON DUPLICATE KEY UPDATE and without IGNORE: a
// duplicate key is the one error it expects, and InnoDB rolls back only that
// statement, so tx stays usable. The existing row is then read with LOCK IN
// SHARE MODE, which sees the newest committed version under any isolation
// level. Taking an expired row over upgrades that lock, which can deadlock
// with a concurrent takeover of the same row: the server then rolls tx back
// and the error is retryable (1213). A key held by a live Guard lease returns
// an error wrapping idem.ErrInProgress. READ COMMITTED is recommended:
// REPEATABLE READ's gap locks make concurrent inserts deadlock more often.
func (s *Store) ProcessTx(ctx context.Context, tx *sql.Tx, msg idem.Message) (idem.Outcome, error) {
	if err := msg.Validate(); err != nil {
		return "", err
	}
	if tx == nil {
		return "", fmt.Errorf("%w: idemmysql: nil transaction", idem.ErrInvalidConfig)
	}
	// A dedupe record holds no lease, so it takes no fencing token (0):
	// that saves a statement per message. A later claim of the key, after
	// the record's window, still gets a token above every token issued.
	const token = 0
	ret := micros(msg.RetentionOrDefault())
	for range maxRaceRetries {
		_, err := tx.ExecContext(ctx, insertProcessed+"(?, ?, 'completed', ?, ?, "+nowSQL+", "+nowSQL+", "+nowSQL+" + INTERVAL ? MICROSECOND)",
			msg.Scope, msg.Key, msg.Fingerprint[:], token, ret)
		if err == nil {
			return idem.Processed, nil
		}
		if errNumber(err) != erDupEntry {
			return "", s.wrap("process", err)
		}
		found, err := s.lookup(ctx, tx, []idem.Message{msg}, []int{0})
		if err != nil {
			return "", s.wrap("process", err)
		}
		e, ok := found[recordRef{msg.Scope, msg.Key}]
		if !ok {
			continue // deleted or purged since the insert
		}
		res, retry, err := storekit.Judge(e.Existing, msg)
		if !retry {
			if err != nil {
				err = fmt.Errorf("idemmysql: process: %w", err)
			}
			return res, err
		}
		took, err := s.takeOver(ctx, tx, msg, token)
		if err != nil {
			return "", err
		}
		if took {
			return idem.Processed, nil
		}
	}
	return "", idem.Retryable(fmt.Errorf("idemmysql: process %q: record kept changing under %d attempts", msg.Key, maxRaceRetries))
}

const insertProcessed = "INSERT INTO idem_records (scope, `key`, state, fingerprint, token, created_at, completed_at, expires_at) VALUES "

// takeoverCondition says when an existing row counts as absent for msg: a
// completed record past its retention (whatever its fingerprint) or a lease
// that expired for the same content. A lease for other content is a
// mismatch even after it expired.
const takeoverCondition = "((state = 'completed' AND expires_at <= " + nowSQL + ") OR (state = 'in_progress' AND lease_expires_at <= " +
	nowSQL + " AND fingerprint = ?))"

// takeOver replaces msg's expired row by a fresh completed dedupe record
// with token (0 for a single message, the batch's token in a batch); false
// when the row is no longer one to take over.
func (s *Store) takeOver(ctx context.Context, tx *sql.Tx, msg idem.Message, token int64) (bool, error) {
	res, err := tx.ExecContext(ctx, "UPDATE idem_records SET state = 'completed', fingerprint = ?, token = ?, result = NULL, failed = FALSE,"+
		" tombstone = FALSE, created_at = "+nowSQL+", lease_expires_at = NULL, completed_at = "+nowSQL+", expires_at = "+nowSQL+
		" + INTERVAL ? MICROSECOND WHERE scope = ? AND `key` = ? AND "+takeoverCondition,
		msg.Fingerprint[:], token, micros(msg.RetentionOrDefault()), msg.Scope, msg.Key, msg.Fingerprint[:])
	if err != nil {
		return false, s.wrap("process: take over", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, s.wrap("process: take over", err)
	}
	return n > 0, nil // expires_at moves forward, so a taken-over row always counts
}

// ProcessBatch is Process for many messages in one transaction, with the
// dedupe records of all of them written by one statement. fn receives the
// transaction and the indexes (into msgs, ascending) of the fresh messages,
// and is not called when there are none. The results say, per message,
// Processed, Duplicate or Mismatch; a Mismatch message is not an error
// of the batch (route it to your dead letters). A key repeated within msgs
// is fresh at its first occurrence and Duplicate (or Mismatch) after.
//
// If fn returns an error the whole batch rolls back and nothing is
// recorded. A key held by a live Guard lease fails the batch with an error
// wrapping idem.ErrInProgress. At most [MaxBatch] messages.
func (s *Store) ProcessBatch(ctx context.Context, msgs []idem.Message, fn func(ctx context.Context, tx *sql.Tx, fresh []int) error) ([]idem.Outcome, error) {
	if err := validateBatch(msgs); err != nil {
		return nil, err
	}
	if fn == nil {
		return nil, fmt.Errorf("%w: nil handler", idem.ErrInvalidConfig)
	}
	if len(msgs) == 0 {
		return nil, nil
	}
	var (
		results []idem.Outcome
		ran     bool
	)
	err := retryDeadlocks(ctx, &ran, func() error {
		return s.inTx(ctx, "process batch", func(tx *sql.Tx) (bool, error) {
			var err error
			results, err = s.ProcessBatchTx(ctx, tx, msgs)
			if err != nil {
				return false, err
			}
			fresh := make([]int, 0, len(msgs))
			for i, r := range results {
				if r == idem.Processed {
					fresh = append(fresh, i)
				}
			}
			if len(fresh) == 0 {
				return false, nil
			}
			ran = true
			if err := fn(ctx, tx, fresh); err != nil {
				return false, fmt.Errorf("idemmysql: process batch: handler: %w", classify(err))
			}
			return true, nil
		})
	})
	if err != nil {
		return nil, err
	}
	return results, nil
}

func validateBatch(msgs []idem.Message) error {
	if err := storekit.ValidateBatch(msgs, MaxBatch, idem.Message.Validate); err != nil {
		return fmt.Errorf("idemmysql: %w", err)
	}
	return nil
}

// recordRef names a record.
type recordRef struct{ scope, key string }

// stored is what lookup found for a key: the record's state for Judge, and
// its token, which tells the batch's own fresh rows (the batch's token)
// from rows that were there before.
type stored struct {
	storekit.Existing
	token int64
}

// ProcessBatchTx records the dedupe rows of msgs in the caller's
// transaction tx and returns, per message, Processed (apply its effect in
// tx), Duplicate or Mismatch. It costs one token, one multi-row INSERT … ON
// DUPLICATE KEY UPDATE that inserts the new keys and changes nothing in the
// existing rows (it only locks them), and one read of all the keys: a row
// that carries the batch's token is one the batch inserted. Rows to take
// over (expired) cost one UPDATE each. Rows are written in (scope, key)
// order, so concurrent batches lock in the same order. See
// [Store.ProcessBatch] for the rules and [Store.ProcessTx] for isolation.
func (s *Store) ProcessBatchTx(ctx context.Context, tx *sql.Tx, msgs []idem.Message) ([]idem.Outcome, error) {
	if err := validateBatch(msgs); err != nil {
		return nil, err
	}
	if tx == nil {
		return nil, fmt.Errorf("%w: idemmysql: nil transaction", idem.ErrInvalidConfig)
	}
	results := make([]idem.Outcome, len(msgs))
	if len(msgs) == 0 {
		return results, nil
	}
	first := storekit.Firsts(msgs)
	pending := make([]int, 0, len(msgs))
	for i := range msgs {
		if first[i] == i {
			pending = append(pending, i)
		}
	}
	// One lock order for every batch, so concurrent batches cannot deadlock.
	sort.Slice(pending, func(a, b int) bool {
		ma, mb := msgs[pending[a]], msgs[pending[b]]
		if ma.Scope != mb.Scope {
			return ma.Scope < mb.Scope
		}
		return ma.Key < mb.Key
	})
	token, err := newToken(ctx, tx, "idem_tokens")
	if err != nil {
		return nil, s.wrap("process batch: next token", err)
	}
	existing := make(map[int]storekit.Existing, len(msgs))
	for attempt := 0; len(pending) > 0; attempt++ {
		if attempt == maxRaceRetries {
			return nil, idem.Retryable(fmt.Errorf("idemmysql: process batch: records kept changing under %d attempts", maxRaceRetries))
		}
		if pending, err = s.insertBatch(ctx, tx, token, msgs, pending, results, existing); err != nil {
			return nil, err
		}
	}
	// Later occurrences of a key compare with what is now stored for it.
	if err := storekit.SettleRepeats(msgs, first, results, func(j int) (storekit.Existing, bool) {
		e, ok := existing[j]
		return e, ok
	}); err != nil {
		return nil, fmt.Errorf("idemmysql: process batch: %w", err)
	}
	return results, nil
}

// insertBatch inserts the dedupe rows of msgs[pending...], fills results
// and existing for the ones it settles, and returns those that raced with a
// deletion and must be inserted again.
func (s *Store) insertBatch(ctx context.Context, tx *sql.Tx, token int64, msgs []idem.Message, pending []int, results []idem.Outcome, existing map[int]storekit.Existing) ([]int, error) {
	args := make([]any, 0, 5*len(pending))
	for _, i := range pending {
		m := &msgs[i]
		args = append(args, m.Scope, m.Key, m.Fingerprint[:], token, micros(m.RetentionOrDefault()))
	}
	row := "(?, ?, 'completed', ?, ?, " + nowSQL + ", " + nowSQL + ", " + nowSQL + " + INTERVAL ? MICROSECOND)"
	// "token = token" changes nothing: an existing row is only locked, and
	// keeps the token that tells it from the batch's own rows.
	if _, err := tx.ExecContext(ctx, insertProcessed+repeatJoin(row, ", ", len(pending))+" ON DUPLICATE KEY UPDATE token = token", args...); err != nil {
		return nil, s.wrap("process batch", err)
	}
	found, err := s.lookup(ctx, tx, msgs, pending)
	if err != nil {
		return nil, s.wrap("process batch", err)
	}
	var again []int
	for _, i := range pending {
		m := msgs[i]
		e, ok := found[recordRef{m.Scope, m.Key}]
		switch {
		case !ok:
			again = append(again, i) // deleted or purged since the insert
			continue
		case e.token == token:
			results[i] = idem.Processed
			continue
		}
		res, retry, err := storekit.Judge(e.Existing, m)
		switch {
		case retry:
			took, err := s.takeOver(ctx, tx, m, token)
			if err != nil {
				return nil, err
			}
			if !took {
				again = append(again, i)
				continue
			}
			results[i] = idem.Processed
		case res != idem.Mismatch && err != nil:
			return nil, fmt.Errorf("idemmysql: process batch message %d: %w", i, err)
		default:
			results[i] = res
			existing[i] = e.Existing
		}
	}
	return again, nil
}

// lookup reads the records of msgs[idx...] with LOCK IN SHARE MODE: the
// newest committed versions, whatever tx's isolation level.
func (s *Store) lookup(ctx context.Context, tx *sql.Tx, msgs []idem.Message, idx []int) (map[recordRef]stored, error) {
	args := make([]any, 0, 2*len(idx))
	for _, i := range idx {
		args = append(args, msgs[i].Scope, msgs[i].Key)
	}
	rows, err := tx.QueryContext(ctx, "SELECT r.scope, r.`key`, r.state, r.fingerprint, r.token, "+liveColumns+" FROM idem_records AS r WHERE "+
		repeatJoin("(r.scope = ? AND r.`key` = ?)", " OR ", len(idx))+" LOCK IN SHARE MODE", args...)
	if err != nil {
		return nil, err
	}
	found := make(map[recordRef]stored, len(idx))
	err = eachRow(rows, func(r *sql.Rows) error {
		var (
			scope, key, state, fp []byte
			e                     stored
		)
		if err := r.Scan(&scope, &key, &state, &fp, &e.token, &e.Live, &e.Expired); err != nil {
			return err
		}
		if len(fp) != len(e.Fingerprint) {
			return errors.New("idemmysql: stored fingerprint has the wrong length")
		}
		e.State = idem.State(state)
		copy(e.Fingerprint[:], fp)
		found[recordRef{string(scope), string(key)}] = e
		return nil
	})
	return found, err
}
