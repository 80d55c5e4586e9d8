// Package idempgx is the PostgreSQL store for idem, over the application's
// own [*pgxpool.Pool] (pgx v5).
//
// It offers two paths over one table, idem_records, keyed by (scope, key):
//
//   - the lease path: [Store] implements [idem.Store], so [idem.Guard], the
//     HTTP middleware and the proxy can run on it;
//   - the transactional path: [Store.Process] and [Store.ProcessBatch] (and
//     their Tx variants) write the dedupe record in the same transaction as
//     the business effect.
//
// # Process versus Guard
//
// Use Process when the effect is a write to the same PostgreSQL database:
//
//	res, err := store.Process(ctx, idem.Message{Scope: "billing", Key: msgID, Fingerprint: fp},
//		func(ctx context.Context, tx pgx.Tx) error {
//			_, err := tx.Exec(ctx, "UPDATE accounts SET balance = balance + $1 WHERE id = $2", amount, id)
//			return err
//		})
//
// The dedupe row and the effect commit together or not at all, so there is
// no window in which one exists without the other, and no lease is needed: a
// concurrent duplicate waits on the row lock and then sees the committed
// record (Duplicate) or, if the first attempt rolled back, runs itself. A
// different fingerprint for a known key is Mismatched (a producer bug; send
// it to the dead letters). [Store.ProcessTx] does the same inside a
// transaction you already have.
//
// [Store.ProcessBatch] inserts the dedupe rows of a whole batch with one
// statement (INSERT … SELECT FROM unnest(…) ON CONFLICT … RETURNING) and
// hands the handler only the fresh messages; that is where throughput comes
// from (see store_benchmark_test.go: a batch of 100 processes messages more
// than 20 times faster than one transaction per message). Keys are sorted
// before the insert so that concurrent batches lock rows in one order and
// cannot deadlock.
//
// A duplicate of a committed record takes no row lock: the first insert is
// ON CONFLICT DO NOTHING, and only the rare rows to take over (a record
// whose retention passed, a Guard lease that expired) go through ON
// CONFLICT DO UPDATE on a second pass. DO UPDATE locks every conflicting
// row, even one its WHERE keeps, to the end of the transaction: with 30%
// duplicates that was a heap write and a WAL record per duplicate, and
// batches that met the same old key waited on each other.
//
// Use an [idem.Guard] over the Store when the effect is outside the database
// (an HTTP call, an email, a payment gateway): it claims a lease with a
// fencing token, heartbeats with Extend, stores the result with Complete and
// releases the key on failure.
//
// All expiries (leases, dedupe windows) are computed with PostgreSQL's
// now(), never the application's clock. Fencing tokens come from the
// sequence idem_token_seq, so they keep increasing for a key across Release,
// Delete and Purge.
//
// # Migrations
//
// The schema is created by embedded, numbered migrations (migration/NNN_name.
// up.sql and .down.sql). Apply them at deploy time with the CLI
// (idem migrate up --store postgres://…) or from Go with a [Migrator]:
//
//	m, _ := idempgx.NewMigrator(pool, &idempgx.MigratorConfig{Schema: "idem"})
//	_, err := m.Up(ctx)
//
// Each migration runs in its own transaction under an advisory lock, so
// replicas that migrate on start-up at the same time are safe. [Migrator.Status]
// lists applied and pending versions; [SQL] prints a migration's SQL for teams
// that run schema changes with their own tools. [Store.Check] reports an
// unreachable server or a schema that is behind ([ErrNotMigrated]); call it
// at start-up.
//
// Config.Schema puts the tables in any schema; every statement names the
// schema explicitly (quoted with pgx.Identifier), so search_path does not
// matter at run time.
//
// # Retention and purging
//
// A record past its expires_at counts as absent: a redelivery after the
// dedupe window runs again. Expired rows stay until [Store.Purge] deletes
// them, in short statements of at most Config.PurgeBatch rows that skip rows
// locked by live traffic; run it periodically (idem keys purge, or a ticker).
//
// # Errors
//
// Errors wrap the idem sentinels (idem.ErrLeaseLost, idem.ErrNotFound,
// idem.ErrFingerprintMismatch, idem.ErrInProgress) and the underlying pgx
// error, so both errors.Is and errors.As(err, &pgErr) work. Transient
// failures are marked with [idem.Retryable]: serialization failures
// (SQLSTATE 40001), deadlocks (40P01), lock timeouts, too many connections,
// a server shutting down or a terminated backend (57P01…), and lost or
// refused connections and timeouts. A commit that fails without an answer
// from the server has an unknown outcome and is retryable too: retrying a
// message that did commit is harmless, it is then a Duplicate.
// [IsRetryableError] is the classifier.
package idempgx
