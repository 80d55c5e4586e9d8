package idem

import (
	"errors"
)

// Sentinel errors. Every error returned by idem and its stores wraps one of
// these (or a driver error) with %w, so callers test with [errors.Is].
var (
	// ErrInvalidKey reports a key that is empty, longer than [MaxKeyLen]
	// bytes or holds a byte outside printable ASCII. It is returned before
	// any store is touched.
	ErrInvalidKey = errors.New("idem: invalid idempotency key")

	// ErrInvalidScope reports a scope longer than [MaxScopeLen] bytes or that
	// is not valid UTF-8.
	ErrInvalidScope = errors.New("idem: invalid scope")

	// ErrInProgress reports that another caller holds a live lease on the key.
	ErrInProgress = errors.New("idem: operation already in progress for this key")

	// ErrFingerprintMismatch reports that a key was reused with a different
	// request or message content. For HTTP this is a 422; for messages it is a
	// producer bug and belongs in the dead letters.
	ErrFingerprintMismatch = errors.New("idem: key reused with a different payload")

	// ErrLeaseLost reports that a fencing token is no longer current: the lease
	// expired and another caller took over, or the record was released,
	// completed or deleted meanwhile.
	ErrLeaseLost = errors.New("idem: lease lost")

	// ErrNotRecorded reports that an operation ran but its result could not
	// be recorded: the store failed, or the lease was lost, when the result
	// was to be stored. The effect happened; the key stays claimed until its
	// lease expires, so a retry meanwhile gets ErrInProgress, and a retry
	// after that runs the operation again. [Guard.Do] wraps the cause too
	// (ErrLeaseLost, or the store's error).
	ErrNotRecorded = errors.New("idem: the operation ran but its result could not be recorded")

	// ErrCommitUnknown reports that a transaction's commit was sent but its
	// answer was lost (the connection broke, or the context ended, while
	// waiting for it): the effect and its dedupe record may or may not have
	// committed. Never acknowledge or re-run on it blindly: a redelivery
	// finds out (Duplicate if the commit happened). Consumers requeue.
	ErrCommitUnknown = errors.New("idem: commit outcome unknown")

	// ErrNotFound reports that no record exists for the (scope, key).
	ErrNotFound = errors.New("idem: record not found")

	// ErrResultDiscarded is returned to a retry of an operation that completed
	// but whose result exceeded the store's size limit: the key is a
	// tombstone, the operation will not run again and its result cannot be
	// replayed.
	ErrResultDiscarded = errors.New("idem: operation completed but its result was too large to store; it will not be re-executed")

	// ErrNotDurable is returned when a component that promises durability is
	// given a store that loses its records on restart (see [Durable]).
	ErrNotDurable = errors.New("idem: store is not durable")

	// ErrInvalidConfig reports a configuration that cannot give the promised
	// guarantee, for example a dedupe window shorter than the redelivery
	// horizon.
	ErrInvalidConfig = errors.New("idem: invalid configuration")

	// ErrClosed reports use of a closed store or consumer.
	ErrClosed = errors.New("idem: closed")
)

// retryableError marks an infrastructure error (connection lost,
// serialization failure, timeout talking to the store) that is safe to retry
// and must not count as a handler failure.
type retryableError struct{ err error }

func (e *retryableError) Error() string   { return e.err.Error() }
func (e *retryableError) Unwrap() error   { return e.err }
func (e *retryableError) Retryable() bool { return true }

// Retryable marks err as a transient infrastructure error: retrying the same
// operation later may succeed and nothing was recorded. Stores use it for
// connection loss, serialization failures (SQLSTATE 40001), deadlocks and
// busy databases. It returns nil for a nil err.
func Retryable(err error) error {
	if err == nil {
		return nil
	}
	if IsRetryable(err) {
		return err
	}
	return &retryableError{err: err}
}

// IsRetryable reports whether err, or any error it wraps, says it is
// retryable: it was marked with [Retryable], or it implements
// interface{ Retryable() bool } and returns true (so a driver's or an
// application's own error types take part without being wrapped).
func IsRetryable(err error) bool {
	if r, ok := err.(interface{ Retryable() bool }); ok && r.Retryable() {
		return true
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		return IsRetryable(u.Unwrap())
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if IsRetryable(e) {
				return true
			}
		}
	}
	return false
}

// StoredError is the error a replay returns when the first execution's error
// was recorded as its final outcome with [Final].
type StoredError struct {
	// Message is the error text recorded by the first execution.
	Message string
}

func (e *StoredError) Error() string { return "idem: replayed error: " + e.Message }

// finalError marks an error as the final outcome of an operation.
type finalError struct{ err error }

func (e *finalError) Error() string { return e.err.Error() }
func (e *finalError) Unwrap() error { return e.err }

// Final marks err as the operation's final outcome: [Guard.Do] records it
// (its message, bounded in size) instead of releasing the key, so retries
// get a [*StoredError] and the operation does not run again. Use it for
// deterministic failures such as "card declined"; leave transient errors
// unmarked so that a retry re-executes. It returns nil for a nil err.
func Final(err error) error {
	if err == nil {
		return nil
	}
	return &finalError{err: err}
}

// IsFinal reports whether err was marked with [Final].
func IsFinal(err error) bool {
	var f *finalError
	return errors.As(err, &f)
}
