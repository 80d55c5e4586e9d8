package idemmysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem"
)

// txOptions are the store's own transactions: READ COMMITTED, so that a
// locking read of an absent key takes no gap lock (REPEATABLE READ's gap
// locks make concurrent inserts into one gap deadlock).
var txOptions = &sql.TxOptions{Isolation: sql.LevelReadCommitted}

// inTx runs fn in a READ COMMITTED transaction and commits if fn asks to.
// A commit that fails without a server answer may or may not have
// committed: see commitError.
func (s *Store) inTx(ctx context.Context, op string, fn func(tx *sql.Tx) (commit bool, err error)) (err error) {
	tx, err := s.db.BeginTx(ctx, txOptions)
	if err != nil {
		return s.wrap(op+": begin", err)
	}
	committed := false
	defer func() {
		if committed {
			return
		}
		// Also on a handler panic. database/sql rolls back by itself when
		// ctx ends; ErrTxDone then only says it already did.
		if rbErr := tx.Rollback(); err == nil && rbErr != nil && !errors.Is(rbErr, sql.ErrTxDone) {
			err = s.wrap(op+": rollback", rbErr)
		}
	}()
	commit, err := fn(tx)
	if err != nil || !commit {
		return err
	}
	if err := ctx.Err(); err != nil {
		// COMMIT was not sent: the deferred rollback ends the transaction.
		return fmt.Errorf("idemmysql: %s: %w", op, err)
	}
	committed = true
	if err := tx.Commit(); err != nil {
		return s.commitError(op, err)
	}
	return nil
}

// commitError classifies a failed COMMIT. The server answered (a
// *mysql.MySQLError): the transaction rolled back. Otherwise the answer was
// lost (connection broken, context ended while COMMIT was in flight) and the
// transaction may have committed, so the error wraps idem.ErrCommitUnknown.
// It is also retryable, because redelivering a committed message is
// harmless (it is then a Duplicate).
func (s *Store) commitError(op string, err error) error {
	if errNumber(err) != 0 {
		return s.wrap(op+": commit", err)
	}
	return fmt.Errorf("idemmysql: %s: %w: %w", op, idem.ErrCommitUnknown, idem.Retryable(err))
}

// retryDeadlocks runs attempt until it returns something else than a
// deadlock (after which the server rolled the whole transaction back, so
// running it again is safe), or maxRaceRetries is reached, or the attempt
// set *ran: the handler ran, and must not run twice.
func retryDeadlocks(ctx context.Context, ran *bool, attempt func() error) error {
	var err error
	for n := range maxRaceRetries {
		if err = attempt(); *ran || !isDeadlock(err) {
			return err
		}
		// Let the winner finish before trying again.
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(n+1) * time.Millisecond):
		}
	}
	return err
}
