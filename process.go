package idem

import (
	"context"
	"fmt"
	"time"
)

// Message identifies one delivery for the transactional path (the SQL
// stores' Process functions): its dedupe key, the scope it belongs to
// (usually the consumer name) and the fingerprint of its content.
type Message struct {
	Scope       string
	Key         string
	Fingerprint Fingerprint
	// Retention is the dedupe window: how long the dedupe record is kept.
	// Zero means DefaultRetention. A record older than its window counts as
	// absent, so a redelivery after the window runs again.
	Retention time.Duration
}

// DefaultRetention is the dedupe window used when none is given.
const DefaultRetention = 24 * time.Hour

// Validate checks the message's key, scope and retention.
func (m Message) Validate() error {
	if err := Validate(m.Scope, m.Key); err != nil {
		return err
	}
	if m.Retention < 0 {
		return fmt.Errorf("%w: retention must not be negative, got %v", ErrInvalidConfig, m.Retention)
	}
	return nil
}

// RetentionOrDefault returns m.Retention, or DefaultRetention when it is zero.
func (m Message) RetentionOrDefault() time.Duration {
	if m.Retention == 0 {
		return DefaultRetention
	}
	return m.Retention
}

// Processor is the transactional path: a store that commits a message's
// dedupe record in the same transaction as the handler's effect. Every SQL
// store implements it with its own transaction type (pgx.Tx, *sql.Tx), and
// every broker adapter accepts one, so an application picks its store and
// its broker independently.
type Processor[Tx any] interface {
	// Process runs fn in a transaction that also records msg, unless msg was
	// seen before within its window: Processed when fn ran and everything
	// committed, Duplicate or Mismatch when fn did not run. An error from fn
	// rolls everything back and is returned wrapped (errors.Is and
	// errors.As see it, and idem.IsRetryable answers for it). An error wrapping
	// ErrCommitUnknown means the commit was sent and its answer lost.
	Process(ctx context.Context, msg Message, fn func(ctx context.Context, tx Tx) error) (Outcome, error)

	// ProcessBatch does the same for many messages in one transaction: fn
	// runs once, with the indexes of the messages that are new (Processed);
	// the others are Duplicate or Mismatch. It returns one Outcome per
	// message, in order.
	ProcessBatch(ctx context.Context, msgs []Message, fn func(ctx context.Context, tx Tx, fresh []int) error) ([]Outcome, error)
}
