package idempgx

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/idem-go/idem"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// inTx runs fn in a transaction from the pool and commits if fn asks to.
// The transaction's BEGIN travels with its first statement (see lazyTx).
// A commit that fails without a server answer may or may not have
// committed: see commitError.
func (s *Store) inTx(ctx context.Context, op string, fn func(tx pgx.Tx) (commit bool, err error)) error {
	return s.inTxKey(ctx, op, "", fn)
}

// inTxKey is inTx for an operation on one key, which its errors name
// (built only for an error, not on every call).
func (s *Store) inTxKey(ctx context.Context, op, key string, fn func(tx pgx.Tx) (commit bool, err error)) (err error) {
	name := func() string {
		if key == "" {
			return op
		}
		return op + " " + strconv.Quote(key)
	}
	tx, err := beginLazy(ctx, s.pool, s.pipeline)
	if err != nil {
		return s.wrap(name()+": begin", err)
	}
	committed := false
	defer func() {
		if committed {
			return
		}
		// Also on a handler panic, and even when ctx is what failed:
		// otherwise the connection would stay checked out mid-transaction.
		rbCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		rbErr := tx.Rollback(rbCtx)
		cancel()
		if err == nil && rbErr != nil && !errors.Is(rbErr, pgx.ErrTxClosed) {
			err = s.wrap(name()+": rollback", rbErr)
		}
	}()
	commit, err := fn(tx)
	if err != nil || !commit {
		return err
	}
	committed = true
	if err := tx.Commit(ctx); err != nil {
		return s.commitError(name(), err)
	}
	return nil
}

// commitError classifies a failed COMMIT. The server answered (a
// *pgconn.PgError): the transaction rolled back. Otherwise the answer was
// lost (connection broken, context ended) and the transaction may have
// committed, so the error wraps idem.ErrCommitUnknown. pgconn.SafeToRetry
// cannot tell them apart here: a connection reset while the COMMIT's answer
// is read comes back as "conn closed", which it calls safe. The error is
// also retryable, because redelivering a committed message is harmless (it
// is then a Duplicate).
func (s *Store) commitError(op string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return s.wrap(op+": commit", err)
	}
	return fmt.Errorf("idempgx: %s: %w: %w", op, idem.ErrCommitUnknown, idem.Retryable(err))
}
