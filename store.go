package idem

import (
	"context"
	"fmt"
	"time"
)

// State is the state of a stored record.
type State string

const (
	// StateInProgress: a caller holds (or held, if LeaseExpiresAt passed) the lease.
	StateInProgress State = "in_progress"
	// StateCompleted: the operation finished; Result holds what to replay.
	StateCompleted State = "completed"
)

// ClaimRequest asks a store for the lease on (Scope, Key).
type ClaimRequest struct {
	Scope       string
	Key         string
	Fingerprint Fingerprint
	// Lease is how long the lease lasts unless extended, measured by the
	// store's clock. It must be positive.
	Lease time.Duration
}

// Claim is a store's answer to a [ClaimRequest].
type Claim struct {
	// Outcome is Acquired, InProgress, Completed or Mismatch.
	Outcome Outcome
	// Token is the fencing token of the lease when Outcome is Acquired. It is
	// strictly greater than every token issued earlier for the same
	// (scope, key).
	Token int64
	// Takeover is true when Acquired replaced a lease that had expired: the
	// previous holder may have done part of the work.
	Takeover bool
	// LeaseExpiresAt is the lease's expiry by the store's clock (Acquired).
	LeaseExpiresAt time.Time
	// Record is the stored record for InProgress, Completed and Mismatch.
	Record *Record
}

// CompleteRequest records the result of the operation that holds Token.
type CompleteRequest struct {
	Scope string
	Key   string
	Token int64
	// Result is what retries will replay. If it is larger than the store's
	// result limit the record becomes a tombstone: completed, with no result.
	Result []byte
	// Failed marks Result as the text of a final error (see [Final]).
	Failed bool
	// Retention is how long the completed record is kept, from completion,
	// by the store's clock. It must be positive.
	Retention time.Duration
}

// Record is a stored (scope, key) record.
type Record struct {
	Scope       string
	Key         string
	State       State
	Fingerprint Fingerprint
	// Token is the fencing token of the latest lease; 0 for a dedupe record
	// written by Process, which holds no lease (idemmysql's ProcessBatch
	// gives its records the batch's token).
	Token int64
	// Result is the stored result of a completed operation (nil for a tombstone).
	Result []byte
	// Failed means Result holds the message of a final error.
	Failed bool
	// Tombstone means the operation completed but its result exceeded the
	// store's limit and was not kept.
	Tombstone bool
	// CreatedAt is when the record was first claimed, by the store's clock.
	CreatedAt time.Time
	// LeaseExpiresAt is when the current lease ends (StateInProgress).
	LeaseExpiresAt time.Time
	// CompletedAt is when the operation completed (StateCompleted).
	CompletedAt time.Time
	// ExpiresAt is when the record may be purged and the key reused.
	ExpiresAt time.Time
}

// Store keeps (scope, key) records durably and arbitrates leases on them.
// Every method validates scope and key before touching the backend.
//
// Implementations must be safe for concurrent use, compute every expiry from
// the backend's own clock, and issue fencing tokens that strictly increase
// per (scope, key), also across Release, Delete and Purge. The conformance
// suite in idemtest/storetest checks all of this against a real backend.
type Store interface {
	// Claim takes the lease on a key that is absent, released or whose lease
	// has expired (a takeover), or reports why it cannot. A completed record
	// whose retention has passed counts as absent. An existing record with a
	// different fingerprint is a Mismatch whatever its state.
	Claim(ctx context.Context, req ClaimRequest) (Claim, error)

	// Complete stores the result and starts the retention period. It fails
	// with ErrLeaseLost unless req.Token is the current token of a record in
	// progress. An expired lease that nobody has taken over may still
	// complete.
	Complete(ctx context.Context, req CompleteRequest) error

	// Release gives the key up after a failure that had no effect, so that
	// the next claim runs the operation again. ErrLeaseLost unless token is
	// current.
	Release(ctx context.Context, scope, key string, token int64) error

	// Extend pushes the lease's expiry to now+lease (store clock) and returns
	// it. ErrLeaseLost unless token is current and the record is in progress.
	Extend(ctx context.Context, scope, key string, token int64, lease time.Duration) (time.Time, error)

	// Get returns the record, or ErrNotFound. Expired records that have not
	// been purged yet are returned as they are.
	Get(ctx context.Context, scope, key string) (Record, error)

	// Delete removes the record whatever its state, or returns ErrNotFound.
	// A holder of the lease then gets ErrLeaseLost.
	Delete(ctx context.Context, scope, key string) error

	// Purge deletes records whose ExpiresAt has passed, in batches of at most
	// limit rows per statement (0 means the store's default), and returns how
	// many it removed. It never holds one long transaction.
	Purge(ctx context.Context, limit int) (int64, error)
}

// Durable is implemented by stores that can say whether their records
// survive a restart. Components that promise exactly-once effects across
// restarts (the HTTP middleware, the proxy, the consumers) refuse a store
// that reports false unless told explicitly that a test is running.
type Durable interface {
	Durable() bool
}

// IsDurable reports whether s survives restarts. A store that does not
// implement [Durable] is assumed durable.
func IsDurable(s Store) bool {
	if d, ok := s.(Durable); ok {
		return d.Durable()
	}
	return true
}

// DefaultMaxResultBytes is the default limit on a stored result.
const DefaultMaxResultBytes = 1 << 20

// ValidateClaim checks a ClaimRequest before a store touches its backend.
func ValidateClaim(req ClaimRequest) error {
	if err := Validate(req.Scope, req.Key); err != nil {
		return err
	}
	if req.Lease <= 0 {
		return fmt.Errorf("%w: lease must be positive, got %v", ErrInvalidConfig, req.Lease)
	}
	return nil
}

// ValidateComplete checks a CompleteRequest before a store touches its backend.
func ValidateComplete(req CompleteRequest) error {
	if err := Validate(req.Scope, req.Key); err != nil {
		return err
	}
	if req.Retention <= 0 {
		return fmt.Errorf("%w: retention must be positive, got %v", ErrInvalidConfig, req.Retention)
	}
	return nil
}
