package inbox

import "github.com/idem-go/idem/inbox/inboxdriver"

// The types a user of the inbox sees. They are declared in
// [inboxdriver], which the engine and the stores share; these are the
// same types under their user-facing names.
type (
	// Message is one message received from a broker (or any producer); a
	// handler gets it with RowID, Attempt and Token set. See
	// [inboxdriver.Message].
	Message = inboxdriver.Message
	// Row is a stored inbox row, as [Admin] lists it. See
	// [inboxdriver.Row].
	Row = inboxdriver.Row
	// Attempt is one failed run in a row's history.
	Attempt = inboxdriver.Attempt
	// State is where an inbox row is in its life.
	State = inboxdriver.State
	// StateCount is one line of [Admin.Stats].
	StateCount = inboxdriver.StateCount
	// ListRequest selects rows for [Admin.List].
	ListRequest = inboxdriver.ListRequest
	// Select names rows for Redrive and Discard: the given ids, or every
	// dead row with All.
	Select = inboxdriver.Select
	// Admin is the operator's view of an inbox: stats, dead rows, redrive
	// and discard (the CLI uses it). Every store's inbox implements it.
	Admin = inboxdriver.Admin
)

// The states of a row, in life order.
const (
	// StatePending: received, waiting for its next attempt.
	StatePending = inboxdriver.StatePending
	// StateRunning: claimed by a worker until its lease ends.
	StateRunning = inboxdriver.StateRunning
	// StateProcessed: a handler's effect committed together with this state.
	StateProcessed = inboxdriver.StateProcessed
	// StateDead: given up; it stays until redriven or discarded.
	StateDead = inboxdriver.StateDead
)

// Limits on what the inbox stores, checked before a store is touched.
const (
	// MaxPayloadBytes is the largest payload Receive accepts.
	MaxPayloadBytes = inboxdriver.MaxPayloadBytes
	// MaxTypeLen is the longest event type, in bytes.
	MaxTypeLen = inboxdriver.MaxTypeLen
	// MaxOrderingKeyLen is the longest ordering key, in bytes.
	MaxOrderingKeyLen = inboxdriver.MaxOrderingKeyLen
	// MaxBatch is the largest Config.BatchSize and ListRequest.Limit.
	MaxBatch = inboxdriver.MaxBatch
)
