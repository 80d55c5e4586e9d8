package idem

// Transitional aliases for the names the shared vocabulary replaced. They
// are removed before the release (see CHANGELOG).

type ProcessResult = Outcome

const Mismatched = Mismatch

type DoOutcome = Outcome

const (
	DoExecuted   = Processed
	DoReplayed   = Duplicate
	DoFailed     = Released
	DoInProgress = InProgress
	DoMismatch   = Mismatch
	DoLeaseLost  = LeaseLost
	DoPanic      = Panicked
	DoRejected   = Rejected
	DoError      = Errored
)
