package idem

import (
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

// ProcessResult is what the transactional path did with one message.
type ProcessResult int

const (
	// Processed: the message was new; its dedupe record and the handler's
	// effect were committed together.
	Processed ProcessResult = iota + 1
	// Duplicate: the message was seen before (within its window); the
	// handler did not run for it.
	Duplicate
	// Mismatched: the key was seen before with a different fingerprint, a
	// producer bug. The handler did not run for it and nothing was recorded.
	Mismatched
)

func (r ProcessResult) String() string {
	switch r {
	case Processed:
		return "processed"
	case Duplicate:
		return "duplicate"
	case Mismatched:
		return "mismatched"
	}
	return fmt.Sprintf("ProcessResult(%d)", int(r))
}
