package outbox

import (
	"context"

	"github.com/idem-go/idem/outbox/outboxdriver"
)

// The types a user of the outbox sees. They are declared in
// [outboxdriver], which the relay and the stores share; these are the same
// types under their user-facing names.
type (
	// Event is one event a producer writes in its own transaction. See
	// [outboxdriver.Event].
	Event = outboxdriver.Event
	// Row is a stored outbox event, as [Admin] lists it.
	Row = outboxdriver.Row
	// State is where an outbox event is in its life.
	State = outboxdriver.State
	// StateCount is one line of [Admin.Stats].
	StateCount = outboxdriver.StateCount
	// ListRequest selects events for [Admin.List].
	ListRequest = outboxdriver.ListRequest
	// Select names dead events for Redrive and Discard: the given row ids,
	// or every dead event with All.
	Select = outboxdriver.Select
	// Admin is the operator's view of an outbox: stats, listing, redrive,
	// discard and purge (the CLI uses it). Every store's outbox implements
	// it.
	Admin = outboxdriver.Admin
	// Driver is what the [Relay] needs of an outbox table.
	Driver = outboxdriver.Driver
)

// Writer writes events in the caller's own transaction: idempgx's Outbox
// is a Writer[pgx.Tx], idemsqlite's and idemmysql's are Writer[*sql.Tx].
//
// Why an interface over the transaction type rather than one
// outbox.Write(ctx, tx, ev): the core module imports only the standard
// library, so it cannot name pgx.Tx, and the table (its schema, its SQL
// dialect) belongs to the store. This is the shape of idem.Processor[Tx]:
// code that writes events can take an outbox.Writer[Tx] and stay
// independent of the store.
type Writer[Tx any] = outboxdriver.Writer[Tx]

// Write writes evs with w in tx: the events become visible to the relay
// when tx commits, and never if it rolls back. Every event is validated
// (see [Event]) before tx is touched; several events go in one statement.
// It is w.Write, for code that reads better with the package name in front.
func Write[Tx any](ctx context.Context, w Writer[Tx], tx Tx, evs ...Event) error {
	return w.Write(ctx, tx, evs...)
}

// The states of an event, in life order.
const (
	// StatePending: committed, waiting for its next publish attempt.
	StatePending = outboxdriver.StatePending
	// StateSending: claimed by a relay until its lease ends.
	StateSending = outboxdriver.StateSending
	// StateSent: the broker confirmed it; purged after the retention.
	StateSent = outboxdriver.StateSent
	// StateDead: given up; it stays until redriven or discarded.
	StateDead = outboxdriver.StateDead
)

// Limits on what the outbox stores, checked before the producer's
// transaction is touched.
const (
	MaxIDLen          = outboxdriver.MaxIDLen
	MaxTopicLen       = outboxdriver.MaxTopicLen
	MaxKeyLen         = outboxdriver.MaxKeyLen
	MaxPayloadBytes   = outboxdriver.MaxPayloadBytes
	MaxHeaders        = outboxdriver.MaxHeaders
	MaxHeaderNameLen  = outboxdriver.MaxHeaderNameLen
	MaxHeaderValueLen = outboxdriver.MaxHeaderValueLen
	// MaxBatch is the largest Config.BatchSize, ListRequest.Limit and
	// number of events one Write takes.
	MaxBatch = outboxdriver.MaxBatch
)
