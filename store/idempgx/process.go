package idempgx

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/storekit"
	"github.com/jackc/pgx/v5"
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
// A concurrent duplicate blocks on the row lock until the first transaction
// ends, then sees its outcome. Infrastructure failures are marked with
// idem.Retryable; a commit whose answer was lost also wraps
// idem.ErrCommitUnknown. Retrying is always safe because a committed
// message is then a Duplicate.
func (s *Store) Process(ctx context.Context, msg idem.Message, fn func(ctx context.Context, tx pgx.Tx) error) (idem.Outcome, error) {
	if err := msg.Validate(); err != nil {
		return "", err
	}
	if fn == nil {
		return "", fmt.Errorf("%w: nil handler", idem.ErrInvalidConfig)
	}
	var res idem.Outcome
	err := s.inTxKey(ctx, "process", msg.Key, func(tx pgx.Tx) (bool, error) {
		var err error
		res, err = s.ProcessTx(ctx, tx, msg)
		if err != nil || res != idem.Processed {
			return false, err
		}
		if err := fn(ctx, tx); err != nil {
			res = ""
			return false, fmt.Errorf("idempgx: process %q: handler: %w", msg.Key, classify(err))
		}
		return true, nil
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
// tx should run at READ COMMITTED (the default). Under REPEATABLE READ or
// SERIALIZABLE a concurrent duplicate fails with a serialization error,
// which is returned as retryable. A key held by a live Guard lease returns
// an error wrapping idem.ErrInProgress. A failed statement aborts tx, so on
// any error roll tx back.
func (s *Store) ProcessTx(ctx context.Context, tx pgx.Tx, msg idem.Message) (idem.Outcome, error) {
	if err := msg.Validate(); err != nil {
		return "", err
	}
	for attempt := range maxRaceRetries {
		var (
			e    storekit.Existing
			seen bool
			err  error
		)
		if attempt == 0 {
			// First try: a duplicate takes no row lock, and the statement
			// returns the existing record with the insert's answer.
			var fresh bool
			e, fresh, seen, err = s.processFirst(ctx, tx, msg)
			if err != nil {
				return "", s.wrap("process", err)
			}
			if fresh {
				return idem.Processed, nil
			}
		} else {
			// A row to take over, or raced.
			var fresh bool
			err := s.writeRow(ctx, tx, s.q.processOne, msg.Scope, msg.Key, msg.Fingerprint[:], micros(msg.RetentionOrDefault())).Scan(&fresh)
			if err == nil {
				return idem.Processed, nil
			}
			if !errors.Is(err, pgx.ErrNoRows) {
				return "", s.wrap("process", err)
			}
		}
		if !seen {
			// A takeover insert reads nothing; the first one misses a record
			// committed by another transaction after the statement began
			// (its snapshot did not hold it), or deleted meanwhile.
			rec, err := scanRecord(tx.QueryRow(ctx, s.q.getLive, msg.Scope, msg.Key), &e.Live, &e.Expired)
			if errors.Is(err, pgx.ErrNoRows) {
				continue // deleted or purged since the insert
			}
			if err != nil {
				return "", s.wrap("process", err)
			}
			e.State, e.Fingerprint = rec.State, rec.Fingerprint
		}
		res, retry, err := storekit.Judge(e, msg)
		if !retry {
			if err != nil {
				err = fmt.Errorf("idempgx: process: %w", err)
			}
			return res, err
		}
	}
	return "", idem.Retryable(fmt.Errorf("idempgx: process %q: record kept changing under %d attempts", msg.Key, maxRaceRetries))
}

// processFirst runs the first try's insert of msg's record (no takeover)
// with the lookup of the record that stopped it: fresh says the record was
// inserted; otherwise seen says whether the statement saw the existing
// record, e. See firstPass.
func (s *Store) processFirst(ctx context.Context, tx pgx.Tx, msg idem.Message) (e storekit.Existing, fresh, seen bool, err error) {
	var (
		state         *string
		fp            []byte
		live, expired *bool
	)
	err = s.writeRow(ctx, tx, s.q.processOneFirst, msg.Scope, msg.Key, msg.Fingerprint[:], micros(msg.RetentionOrDefault())).
		Scan(&state, &fp, &live, &expired)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return e, false, false, nil
	case err != nil:
		return e, false, false, err
	case state == nil:
		return e, true, false, nil
	}
	e.State, e.Live, e.Expired = idem.State(*state), *live, *expired
	copy(e.Fingerprint[:], fp)
	return e, false, true, nil
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
func (s *Store) ProcessBatch(ctx context.Context, msgs []idem.Message, fn func(ctx context.Context, tx pgx.Tx, fresh []int) error) ([]idem.Outcome, error) {
	if err := validateBatch(msgs); err != nil {
		return nil, err
	}
	if fn == nil {
		return nil, fmt.Errorf("%w: nil handler", idem.ErrInvalidConfig)
	}
	if len(msgs) == 0 {
		return nil, nil
	}
	_, first, pending := batchPlan(msgs)
	if s.copyEligible(len(pending)) {
		results, err := s.processBatchCopy(ctx, msgs, first, pending, fn)
		if !errors.Is(err, errCopyMet) {
			return results, err
		}
		// A key was stored meanwhile: nothing was written, fn did not run.
	}
	var results []idem.Outcome
	err := s.inTx(ctx, "process batch", func(tx pgx.Tx) (bool, error) {
		results = make([]idem.Outcome, len(msgs))
		stored := make(map[int]storekit.Existing, len(msgs))
		if err := s.settleBatch(ctx, tx, msgs, first, pending, 0, results, stored); err != nil {
			return false, err
		}
		return runBatchHandler(ctx, tx, results, fn)
	})
	if err != nil {
		return nil, err
	}
	return results, nil
}

func validateBatch(msgs []idem.Message) error {
	if err := storekit.ValidateBatch(msgs, MaxBatch, idem.Message.Validate); err != nil {
		return fmt.Errorf("idempgx: %w", err)
	}
	return nil
}

// recordRef names a record.
type recordRef struct{ scope, key string }

// ProcessBatchTx records the dedupe rows of msgs in the caller's
// transaction tx and returns, per message, Processed (apply its effect in
// tx), Duplicate or Mismatch. It costs one statement to insert all of
// them plus, only when some already existed, one to classify those. See
// [Store.ProcessBatch] for the rules and [Store.ProcessTx] for isolation.
func (s *Store) ProcessBatchTx(ctx context.Context, tx pgx.Tx, msgs []idem.Message) ([]idem.Outcome, error) {
	if err := validateBatch(msgs); err != nil {
		return nil, err
	}
	results, first, pending := batchPlan(msgs)
	stored := make(map[int]storekit.Existing, len(msgs))
	if err := s.settleBatch(ctx, tx, msgs, first, pending, 0, results, stored); err != nil {
		return nil, err
	}
	return results, nil
}

// batchPlan returns the zero results of msgs, the first occurrence of each
// message's key (storekit.Firsts) and the indexes of those first
// occurrences sorted by (scope, key): one lock order for every batch, so
// concurrent batches cannot deadlock.
func batchPlan(msgs []idem.Message) (results []idem.Outcome, first, pending []int) {
	results = make([]idem.Outcome, len(msgs))
	first = storekit.Firsts(msgs)
	pending = make([]int, 0, len(msgs))
	for i := range msgs {
		if first[i] == i {
			pending = append(pending, i)
		}
	}
	sort.Slice(pending, func(a, b int) bool {
		ma, mb := msgs[pending[a]], msgs[pending[b]]
		if ma.Scope != mb.Scope {
			return ma.Scope < mb.Scope
		}
		return ma.Key < mb.Key
	})
	return results, first, pending
}

// settleBatch inserts the records of msgs[pending...] with the INSERT
// statements, from the given attempt on (0: a first pass that leaves
// existing rows alone; later ones take expired rows over), then settles
// the later occurrences of each key.
func (s *Store) settleBatch(ctx context.Context, tx pgx.Tx, msgs []idem.Message, first, pending []int, attempt int, results []idem.Outcome, stored map[int]storekit.Existing) error {
	for ; len(pending) > 0; attempt++ {
		if attempt == maxRaceRetries {
			return idem.Retryable(fmt.Errorf("idempgx: process batch: records kept changing under %d attempts", maxRaceRetries))
		}
		var err error
		query := s.q.processBatchNew // first pass: duplicates take no row lock
		if attempt > 0 {
			query = s.q.processBatch // rows to take over, or raced
		}
		if pending, err = s.insertBatch(ctx, tx, query, msgs, pending, results, stored); err != nil {
			return err
		}
	}
	// Later occurrences of a key compare with what is now stored for it.
	if err := storekit.SettleRepeats(msgs, first, results, func(j int) (storekit.Existing, bool) {
		e, ok := stored[j]
		return e, ok
	}); err != nil {
		return fmt.Errorf("idempgx: process batch: %w", err)
	}
	return nil
}

// insertBatch inserts the dedupe rows of msgs[pending...], fills results
// and stored for the ones it settles, and returns those that raced with an
// expiry or deletion and must be inserted again.
func (s *Store) insertBatch(ctx context.Context, tx pgx.Tx, query string, msgs []idem.Message, pending []int, results []idem.Outcome, stored map[int]storekit.Existing) ([]int, error) {
	scopes := make([]string, len(pending))
	keys := make([]string, len(pending))
	fps := make([][]byte, len(pending))
	rets := make([]int64, len(pending))
	for n, i := range pending {
		m := &msgs[i]
		scopes[n], keys[n], fps[n], rets[n] = m.Scope, m.Key, m.Fingerprint[:], micros(m.RetentionOrDefault())
	}
	rows, done, err := s.writeRows(ctx, tx, query, scopes, keys, fps, rets)
	if err != nil {
		return nil, s.wrap("process batch", err)
	}
	fresh := make(map[recordRef]bool, len(pending))
	var ref recordRef
	_, err = pgx.ForEachRow(rows, []any{&ref.scope, &ref.key}, func() error {
		fresh[ref] = true
		return nil
	})
	if derr := done(); err == nil {
		err = derr
	}
	if err != nil {
		return nil, s.wrap("process batch", err)
	}
	var conflicted []int
	for _, i := range pending {
		m := &msgs[i]
		if fresh[recordRef{m.Scope, m.Key}] {
			results[i] = idem.Processed
		} else {
			conflicted = append(conflicted, i)
		}
	}
	if len(conflicted) == 0 {
		return nil, nil
	}

	found, err := s.lookup(ctx, tx, msgs, conflicted)
	if err != nil {
		return nil, err
	}
	// Deleted or purged since the insert, or to take over: again.
	return judgeFound(msgs, conflicted, found, results, stored)
}

// lookupArgs returns the arguments of processLookup for msgs[idx...]: in
// the plain layout a cached statement, in the partitioned one planned for
// its arguments on every call (see processLookup).
func (s *Store) lookupArgs(msgs []idem.Message, idx []int) []any {
	scopes := make([]string, len(idx))
	keys := make([]string, len(idx))
	for n, i := range idx {
		scopes[n], keys[n] = msgs[i].Scope, msgs[i].Key
	}
	args := []any{scopes, keys}
	if s.q.planLookup {
		args = append([]any{pgx.QueryExecModeExec}, args...)
	}
	return args
}

// lookup reads the stored records of msgs[idx...], by reference.
func (s *Store) lookup(ctx context.Context, tx pgx.Tx, msgs []idem.Message, idx []int) (map[recordRef]storekit.Existing, error) {
	rows, err := tx.Query(ctx, s.q.processLookup, s.lookupArgs(msgs, idx)...)
	if err != nil {
		return nil, s.wrap("process batch", err)
	}
	return s.scanLookup(rows, len(idx))
}

// scanLookup reads processLookup's rows and closes them.
func (s *Store) scanLookup(rows pgx.Rows, n int) (map[recordRef]storekit.Existing, error) {
	found := make(map[recordRef]storekit.Existing, n)
	var (
		ref   recordRef
		e     storekit.Existing
		state string
		fp    []byte
	)
	if _, err := pgx.ForEachRow(rows, []any{&ref.scope, &ref.key, &state, &fp, &e.Live, &e.Expired}, func() error {
		e.State = idem.State(state)
		copy(e.Fingerprint[:], fp)
		found[ref] = e
		return nil
	}); err != nil {
		return nil, s.wrap("process batch", err)
	}
	return found, nil
}

// judgeFound settles msgs[idx...] against their stored records (found):
// Duplicate or Mismatch into results, the record into stored. It returns,
// in idx's order, those to insert again: without a record (deleted or
// purged since the insert that met it) or with one to take over.
func judgeFound(msgs []idem.Message, idx []int, found map[recordRef]storekit.Existing, results []idem.Outcome, stored map[int]storekit.Existing) ([]int, error) {
	var again []int
	for _, i := range idx {
		m := msgs[i]
		e, ok := found[recordRef{m.Scope, m.Key}]
		if !ok {
			again = append(again, i)
			continue
		}
		res, retry, err := storekit.Judge(e, m)
		switch {
		case retry:
			again = append(again, i)
		case res != idem.Mismatch && err != nil:
			return nil, fmt.Errorf("idempgx: process batch message %d: %w", i, err)
		default:
			results[i] = res
			stored[i] = e
		}
	}
	return again, nil
}
