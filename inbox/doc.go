// Package inbox implements the inbox pattern: a message is written to an
// inbox table when it arrives (so the broker can be acked at once) and
// processed later by workers, with retries that survive restarts, dead
// letters and redrive.
//
// The engine here is shared; the tables live in the SQL stores, which
// implement [inboxdriver.Backend]: store/idempgx (PostgreSQL, Store.Inbox,
// handlers get a pgx.Tx) and store/idemsqlite (SQLite, Store.Inbox,
// handlers get a *sql.Tx). Both create their tables in migration 2. This
// package is the user API; the contract with the stores and the helpers
// they share are in inbox/inboxdriver (whose data types this package
// re-exports), and their conformance suite in inbox/inboxtest.
//
// # Receiving
//
// A store's Receive inserts the message keyed by (Source, ID) with ON
// CONFLICT DO NOTHING and reports whether it was new; receiving it again is
// harmless. ReceiveTx does the same in the caller's transaction. A message
// whose id was seen with other content (a different [idem.Fingerprint];
// by default the SHA-256 of type and payload) is reported with an error
// wrapping idem.ErrFingerprintMismatch ([inboxdriver.ReceiveMismatch]) — a producer bug,
// never silently dropped. Ack the broker only after Receive returned.
//
// # Processing
//
// A [Worker] runs Config.Workers loops. Each claims a batch of due rows
// (PostgreSQL: FOR UPDATE SKIP LOCKED over a partial index of unfinished
// rows; SQLite: a BEGIN IMMEDIATE transaction) and takes a lease on them
// with a fresh fencing token. Each row is dispatched by its Type to the
// [Handler] registered with [Worker.Handle]. The handler's effect and the
// "processed" mark commit in one transaction, and the mark is guarded by
// the token: a worker whose lease was taken over gets idem.ErrLeaseLost and
// its transaction rolls back, so the effect happens once.
//
// Long handlers are safe: a heartbeat extends the leases of the batch every
// Lease/3, and cancels a handler's context if its lease is lost. Rows of a
// crashed worker are taken over by the normal claim after their lease
// expires; a completed row is never taken over.
//
// # Failures, dead letters and redrive
//
// A handler error (or panic) rolls the effect back, increments attempts,
// records the error in last_error and in the row's attempt history, and
// schedules the next attempt at the database's now + a full-jitter delay
// from Config.Retry. After MaxAttempts the row is dead and keeps its whole
// history. retry.Permanent errors and event types without a handler are
// dead at once. A dead row keeps its reason as an [idem.DeadReason]
// (idem.DeadMaxAttempts, idem.DeadPermanent, idem.DeadNoHandler), which
// [Event] also carries, so metrics can label dead letters by it. idem.Retryable errors (the database went
// away) are retried without counting an attempt.
//
// Dead rows stay until an operator looks at them: [Admin] (and the CLI,
// `idem inbox stats|dead|show|redrive|discard`) lists them with reason,
// attempts and last error; redrive resets attempts and makes them due now;
// discard deletes them.
//
// # Ordering
//
// With Config.Ordered, messages that share a non-empty OrderingKey are
// processed one at a time in receive order: a row is claimable only when no
// earlier row of its key is pending or running. A failing message holds
// back its own key until it is processed or dead; other keys go on. Dead
// rows do not block their key (redrive them deliberately).
//
// # Hooks
//
// Config.Hooks takes values that implement [RunStartHook], [RunEndHook] or
// both (contrib/idemprom's Metrics and contrib/idemotel's Telemetry do):
// the start hooks are called before a row's handler runs and the handler
// runs with the context they return, so a tracing hook's span is the
// parent of the handler's spans; the end hooks are called once per run
// with its [Event]: outcome, dead reason, error and duration.
//
// # Retention and shutdown
//
// Processed rows are deleted after Config.Retention (default 24h), in
// batches, by a purge loop in every worker; receiving a (source, id) again
// after its row was purged counts as new, so the retention must exceed the
// broker's redelivery horizon. Dead rows are never purged.
//
// [Worker.Stop] stops claiming, lets every loop finish the row it is
// running and releases the rows it claimed but did not start (they are due
// again at once); if its context ends first, running handlers are
// cancelled and their rows released too. [Worker.Run] wraps Start and Stop
// around a context, for main functions.
package inbox
