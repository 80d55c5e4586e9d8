// Package inboxdriver is the contract between the inbox engine
// (package inbox) and the databases that hold inbox tables, and the
// helpers every implementation shares, apart from the user API, as River's
// riverdriver is apart from river. Implement [Backend] (store/idempgx and
// store/idemsqlite do) and run the conformance suite, inbox/inboxtest.
//
// The data types users see (Message, Row, Attempt, State, StateCount,
// ListRequest, Select, Admin and the limits) are declared here so that the
// engine and the drivers share them; package inbox re-exports them under
// the same names, and users need not import this package. StateCount,
// ListRequest, Select and Lease are aliases of the state-table types the
// outbox shares (over its own State for the first two).
package inboxdriver

import (
	"context"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/statetable"
)

// Limits on what the inbox stores, checked before a backend is touched.
const (
	// MaxPayloadBytes is the largest payload Receive accepts.
	MaxPayloadBytes = 4 << 20
	// MaxTypeLen is the longest event type, in bytes.
	MaxTypeLen = 255
	// MaxOrderingKeyLen is the longest ordering key, in bytes.
	MaxOrderingKeyLen = 255
	// MaxErrorBytes bounds a stored error text (last_error and the attempt
	// history); longer texts are cut.
	MaxErrorBytes = statetable.MaxErrorBytes
	// MaxBatch is the largest claim a backend serves in one statement.
	MaxBatch = statetable.MaxBatch
)

// State is where an inbox row is in its life.
type State string

const (
	// StatePending: received, waiting for its next attempt (NextAttemptAt).
	StatePending State = "pending"
	// StateRunning: claimed by a worker whose lease ends at LeaseExpiresAt.
	// After that the row is due again and the next claim takes it over.
	StateRunning State = "running"
	// StateProcessed: a handler's effect committed together with this state.
	StateProcessed State = "processed"
	// StateDead: given up (max attempts, permanent error or unknown event
	// type). It stays until redriven or discarded.
	StateDead State = "dead"
)

// States lists every state, in life order. The slice is new on each call.
func States() []State { return []State{StatePending, StateRunning, StateProcessed, StateDead} }

// Message is one message received from a broker (or any producer).
//
// (Source, ID) is its identity: receiving the same pair again is a
// duplicate. Type selects the handler. OrderingKey, when set and the worker
// runs in ordered mode, serialises messages that share it.
type Message struct {
	// Source names where the message came from (a queue, topic or
	// producer): 0–1024 bytes of UTF-8.
	Source string
	// ID is the producer's message id: 1–255 bytes of printable ASCII.
	ID string
	// Type is the event type handlers are registered for: 1–255 bytes.
	Type string
	// Payload is the message body, at most MaxPayloadBytes.
	Payload []byte
	// OrderingKey groups messages that must be processed in receive order
	// (ordered mode only). Empty means unordered.
	OrderingKey string
	// Fingerprint identifies the content. Zero means the SHA-256 of Type
	// and Payload.
	Fingerprint idem.Fingerprint

	// RowID is the inbox row's id. Set for handlers; ignored by Receive.
	RowID int64
	// Attempt is the run number (1 for the first). Set for handlers.
	Attempt int
	// Token is the fencing token of the worker's lease. Set for handlers:
	// combine it with (Source, ID) to derive a downstream idempotency key.
	Token int64
}

// Prepare validates m and fills in its fingerprint. Backends call it in
// Receive before touching the database.
func Prepare(m Message) (Message, error) {
	if err := idem.Validate(m.Source, m.ID); err != nil {
		return m, fmt.Errorf("inbox: message %q: %w", m.ID, err)
	}
	switch {
	case m.Type == "" || len(m.Type) > MaxTypeLen || !utf8.ValidString(m.Type):
		return m, fmt.Errorf("%w: inbox: message %q: type must be 1-%d bytes of UTF-8", idem.ErrInvalidConfig, m.ID, MaxTypeLen)
	case len(m.OrderingKey) > MaxOrderingKeyLen || !utf8.ValidString(m.OrderingKey):
		return m, fmt.Errorf("%w: inbox: message %q: ordering key must be at most %d bytes of UTF-8", idem.ErrInvalidConfig, m.ID, MaxOrderingKeyLen)
	case len(m.Payload) > MaxPayloadBytes:
		return m, fmt.Errorf("%w: inbox: message %q: payload is %d bytes, the limit is %d", idem.ErrInvalidConfig, m.ID, len(m.Payload), MaxPayloadBytes)
	}
	if m.Fingerprint.IsZero() {
		m.Fingerprint = idem.FingerprintParts([]byte(m.Type), m.Payload)
	}
	if m.Payload == nil {
		m.Payload = []byte{}
	}
	return m, nil
}

// ReceiveMismatch returns the error Backend.Receive reports when
// (source, id) was received before, as row rowID, with other content: a
// producer bug. It wraps [idem.ErrFingerprintMismatch].
func ReceiveMismatch(source, id string, rowID int64) error {
	return fmt.Errorf("inbox: message %q from %q (row %d): %w", id, source, rowID, idem.ErrFingerprintMismatch)
}

// Row is a stored inbox row.
type Row struct {
	ID          int64
	Source      string
	MessageID   string
	Type        string
	Payload     []byte
	OrderingKey string
	Fingerprint idem.Fingerprint
	State       State
	// Attempts counts the failed runs so far.
	Attempts int
	// Token is the fencing token of the latest claim (0 if never claimed).
	Token     int64
	LastError string
	// DeadReason says why the row is dead (empty unless it is). A row that
	// died before dead reasons were typed holds the free text of then
	// ("permanent error", "failed 3 times (max attempts 3)", …).
	DeadReason     idem.DeadReason
	ReceivedAt     time.Time
	NextAttemptAt  time.Time
	LeaseExpiresAt time.Time
	ProcessedAt    time.Time
}

// Message returns the row as a handler sees it.
func (r Row) Message() Message {
	return Message{Source: r.Source, ID: r.MessageID, Type: r.Type, Payload: r.Payload, OrderingKey: r.OrderingKey,
		Fingerprint: r.Fingerprint, RowID: r.ID, Attempt: r.Attempts + 1, Token: r.Token}
}

// Lease identifies one claimed row: its id and the fencing token of the claim.
// It is the outbox's Lease too (outboxdriver.Lease).
type Lease = statetable.Lease

// Attempt is one failed run in a row's history.
type Attempt struct {
	Number int
	At     time.Time
	Error  string
}

// ClaimRequest asks a backend for due rows.
type ClaimRequest struct {
	// Limit is how many rows to claim, 1..MaxBatch.
	Limit int
	// Lease is how long the claim holds, by the database clock.
	Lease time.Duration
	// Ordered skips rows that have an earlier unfinished (pending or
	// running) row with the same ordering key.
	Ordered bool
}

// FailRequest records a failed run.
type FailRequest struct {
	Lease
	// Error is the failure's text (cut to MaxErrorBytes).
	Error string
	// Delay schedules the next attempt at the database's now + Delay. The
	// engine draws it with full jitter from its retry policy.
	Delay time.Duration
	// Dead moves the row to the dead letters with DeadReason.
	Dead       bool
	DeadReason idem.DeadReason
	// Uncounted leaves attempts unchanged and adds no history: an
	// infrastructure failure, not the message's fault.
	Uncounted bool
}

// StateCount is one line of [Admin.Stats]: State, Count, and Oldest, the
// age by the database clock of the oldest row in the state (by receive
// time), zero when Count is 0.
type StateCount = statetable.Count[State]

// ListRequest selects rows for [Admin.List]: those in State with an id
// above AfterID (paging), at most Limit (1..MaxBatch; 0 means 100).
type ListRequest = statetable.ListRequest[State]

// Select names rows for Redrive and Discard: the given ids, or every dead
// row with All. It is the outbox's Select too (outboxdriver.Select).
type Select = statetable.Select

// Admin is the operator's view of an inbox (the CLI uses it; package inbox
// re-exports it).
type Admin interface {
	// Stats counts rows by state, every state listed.
	Stats(ctx context.Context) ([]StateCount, error)
	// List returns rows in a state by id.
	List(ctx context.Context, req ListRequest) ([]Row, error)
	// Get returns a row and its attempt history, or an error wrapping
	// idem.ErrNotFound.
	Get(ctx context.Context, id int64) (Row, []Attempt, error)
	// Redrive moves dead rows back to pending with attempts reset and the
	// next attempt now; it returns how many it moved. The history stays.
	Redrive(ctx context.Context, sel Select) (int64, error)
	// Discard deletes dead rows and returns how many.
	Discard(ctx context.Context, sel Select) (int64, error)
}

// Backend is an inbox table in one database. Tx is the database's
// transaction type handed to handlers (pgx.Tx, *sql.Tx).
//
// Every method that takes a Lease must fail with an error wrapping
// idem.ErrLeaseLost unless the token is the row's current one and the row is
// running: that is what keeps a worker whose lease was taken over from
// committing anything.
type Backend[Tx any] interface {
	Admin
	// Receive inserts the message unless (Source, ID) exists and reports
	// whether it was new. An existing id with another fingerprint is an
	// error from [ReceiveMismatch], wrapping idem.ErrFingerprintMismatch; the
	// stored row is untouched.
	Receive(ctx context.Context, msg Message) (bool, error)
	// ReceiveTx is Receive in the caller's transaction.
	ReceiveTx(ctx context.Context, tx Tx, msg Message) (bool, error)
	// Claim leases up to req.Limit due rows: pending rows whose next attempt
	// has come and running rows whose lease expired, oldest due first, each
	// with a fresh fencing token.
	Claim(ctx context.Context, req ClaimRequest) ([]Row, error)
	// Complete runs fn in a transaction and marks the row processed in the
	// same transaction, guarded by the lease: if the token is no longer
	// current the transaction rolls back and the error wraps
	// idem.ErrLeaseLost. An error from fn rolls back and is returned as is.
	Complete(ctx context.Context, l Lease, fn func(ctx context.Context, tx Tx) error) error
	// Fail records a failed run (see [FailRequest]).
	Fail(ctx context.Context, req FailRequest) error
	// Extend pushes the leases to now + lease and returns the ids still
	// held; the others were lost.
	Extend(ctx context.Context, ls []Lease, lease time.Duration) ([]int64, error)
	// Release gives leased rows back (pending, due now, attempts unchanged)
	// and returns how many it released.
	Release(ctx context.Context, ls []Lease) (int64, error)
	// PurgeProcessed deletes processed rows older than olderThan (by
	// processed time, database clock), at most limit rows per statement,
	// until none is left, and returns how many it deleted.
	PurgeProcessed(ctx context.Context, olderThan time.Duration, limit int) (int64, error)
}

// CutError bounds an error text to MaxErrorBytes without splitting a UTF-8
// sequence.
func CutError(s string) string { return statetable.CutError(s) }

// ValidateSelect checks a Redrive or Discard selection.
func ValidateSelect(sel Select) error { return statetable.ValidateSelect("inbox", sel) }

// ValidateClaim checks a ClaimRequest.
func ValidateClaim(req ClaimRequest) error {
	return statetable.ValidateClaim("inbox", req.Limit, req.Lease)
}

// ListLimit returns the effective limit of a ListRequest, or an error.
func ListLimit(req ListRequest) (int, error) { return statetable.ListLimit("inbox", req) }

// StatsInOrder lists every state in [States] order, taking counts from by
// (a state missing from by counts zero). Backends use it for Stats.
func StatsInOrder(by map[State]StateCount) []StateCount { return statetable.StatsInOrder(States(), by) }
