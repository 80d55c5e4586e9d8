package idem

// Outcome is what became of one operation, in one vocabulary shared by every
// package: a store's answer to a claim, a [Guard.Do] call, a [Processor]'s
// verdict on a message, a consumer's delivery, an inbox run and an HTTP
// request. Each reports the subset its documentation lists. The value is
// the label metrics and logs use; a hook that counts outcomes should map a
// value it does not know to "other": new outcomes may be added.
type Outcome string

// The claim outcomes a [Store] returns.
const (
	// Acquired: the caller now holds the lease and must Complete or Release
	// with the returned token. Claim.Takeover tells whether a stale lease was
	// replaced.
	Acquired Outcome = "acquired"
	// Completed: the operation already ran; Claim.Record holds its result.
	Completed Outcome = "completed"
)

// The outcomes shared by every path.
const (
	// Processed: the work ran and its result (or effect, with its dedupe
	// record) was recorded.
	Processed Outcome = "processed"
	// Duplicate: the key was seen before; the work did not run and the
	// stored result, if any, was replayed.
	Duplicate Outcome = "duplicate"
	// Mismatch: the key exists with a different fingerprint (a reused key,
	// or a producer bug). The work did not run; the stored record is
	// untouched.
	Mismatch Outcome = "mismatch"
	// InProgress: another caller holds a live lease on the key.
	InProgress Outcome = "in_progress"
	// Released: the work failed (or ran without a result to keep) and the key
	// was released so that a retry runs it again.
	Released Outcome = "released"
	// LeaseLost: the lease was taken over or deleted while the work ran;
	// nothing was recorded by this execution.
	LeaseLost Outcome = "lease_lost"
	// Panicked: the work panicked; the key was released and the panic went on.
	Panicked Outcome = "panicked"
	// Rejected: invalid input (key, scope, request); the store was not touched.
	Rejected Outcome = "rejected"
	// Errored: the store failed, or the context ended, before a result was
	// recorded.
	Errored Outcome = "error"
	// NotRecorded: the work ran but its result could not be recorded
	// ([ErrNotRecorded]); the key stays claimed until its lease expires.
	NotRecorded Outcome = "not_recorded"
)

// The outcomes of the message paths (consumers and the inbox).
const (
	// Retried: the work failed and the message is scheduled for a later
	// attempt.
	Retried Outcome = "retried"
	// DeadLettered: the message went to the dead letters (see [DeadReason]).
	DeadLettered Outcome = "dead_lettered"
	// Requeued: the delivery was handed back to the broker unsettled.
	Requeued Outcome = "requeued"
	// Abandoned: the context ended first; nothing was settled and the broker
	// will redeliver.
	Abandoned Outcome = "abandoned"
)

// The outcomes of the HTTP paths.
const (
	// Discarded: the operation completed but its result was too large to
	// keep; a retry gets 410 (see [ErrResultDiscarded]).
	Discarded Outcome = "discarded"
	// Tombstoned: the work ran; its result was too large to keep, or the
	// connection switched protocols, so only the fact that it ran is kept.
	Tombstoned Outcome = "tombstoned"
	// Canceled: the client went away before the work started.
	Canceled Outcome = "canceled"
	// InDoubt: a proxy's upstream received the request and did not answer;
	// whether it acted is unknown.
	InDoubt Outcome = "in_doubt"
)

func (o Outcome) String() string { return string(o) }

// DeadReason says why a message went to the dead letters, in one vocabulary
// for every consumer and the inbox. Metrics label dead letters with it.
type DeadReason string

const (
	// DeadMaxAttempts: the work failed as many times as the policy allows.
	DeadMaxAttempts DeadReason = "max_attempts"
	// DeadPermanent: the work returned an error marked retry.Permanent.
	DeadPermanent DeadReason = "permanent"
	// DeadMismatch: the message id was seen before with a different payload.
	DeadMismatch DeadReason = "mismatch"
	// DeadMissingID: the message had no id and content keys are off.
	DeadMissingID DeadReason = "missing_id"
	// DeadInvalidID: the message id is not a valid idem key.
	DeadInvalidID DeadReason = "invalid_id"
	// DeadNoHandler: no handler is registered for the message's type.
	DeadNoHandler DeadReason = "no_handler"
)

func (r DeadReason) String() string { return string(r) }
