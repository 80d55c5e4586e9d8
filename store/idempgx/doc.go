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
// different fingerprint for a known key is Mismatch (a producer bug; send
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
// Process's insert reads the record that stopped it in the same statement,
// and the store's transactions send BEGIN in one round trip with their
// first statement, so a duplicate costs two round trips (BEGIN with the
// insert, ROLLBACK) where the hand-written INSERT … ON CONFLICT DO NOTHING
// transaction costs three, and a fresh message three (with one statement
// of its handler) to the hand-written four. The read uses the statement's
// snapshot, which misses a record that another transaction committed while
// the insert waited on it; such a message is looked up again by a
// statement of its own. ProcessBatch keeps its lookup
// of the conflicted keys apart: one primary-key probe per key (a LATERAL
// subquery with LIMIT 1, whose cached generic plan uses the index where a
// join's would keep scanning a table that was small when it was planned).
// It is a cached statement in the plain layout and planned on every call
// in the partitioned one, whose rotations make an empty partition current.
//
// # Batches written with COPY
//
// In the plain layout, a ProcessBatch of 64 distinct keys or more writes
// its records with COPY FROM STDIN (binary) instead of the INSERT: the
// heap's multi-insert costs about a third less server time per row, and a
// batch of 1,000 fresh keys with its ledger effect then keeps up with a
// bare 1,000-key INSERT of two columns (see docs/bench/round2-notes.md).
// COPY has no ON CONFLICT, so:
//
//   - while recent batches met no stored key, a batch is copied without
//     looking first; once one did (about 16 clean batches after the last
//     that did), its keys are looked up first, in the round trip that
//     carries BEGIN, and only the absent ones are copied; duplicates and
//     mismatches are settled from the lookup, and records to take over go
//     through the INSERT that takes over;
//   - a copied key that another transaction stored meanwhile fails the
//     COPY with a unique violation before the handler ran: the batch rolls
//     back and runs again, whole, on the INSERT path. The primary key
//     decides, as it does for the INSERT; nothing is judged from a stale
//     read. When that happens after a lookup (consumers racing on the same
//     keys), batches take the INSERT path for a pause of 100 ms, doubled
//     by each such COPY in a row up to 1 s.
//
// Copied records are what the INSERT writes: the transaction's now(), read
// with BEGIN, for created_at and completed_at, now() plus the retention for
// expires_at, token 0. [Store.ProcessBatchTx] (a transaction of yours: a
// failed COPY would abort your work too) and the partitioned layout (whose
// uniqueness across partitions the INSERT checks) keep the INSERT, and so
// does every batch with Config.NoCopy, for a pooler or proxy that does not
// pass COPY through.
//
// Use an [idem.Guard] over the Store when the effect is outside the database
// (an HTTP call, an email, a payment gateway): it claims a lease with a
// fencing token, heartbeats with Extend, stores the result with Complete and
// releases the key on failure.
//
// # Lease holders go first
//
// A Guard's heartbeat (Extend) must reach the server within its lease; a
// claim that waits a little longer only waits. pgxpool hands connections
// out first come, first served, so a burst of claims (a traffic spike, or
// the polls of GuardConfig.Wait) queued the heartbeats behind all of it: a
// lease could expire while its holder was healthy and its function still
// running, and the next caller took over and ran the effect again.
//
// So Claim, Get, Delete and Purge use at most MaxConns - Config.HolderConns
// of the pool's connections at once, and wait for one of them in a queue
// of the store's own, in Go, before they ask the pool. Extend, Complete and
// Release (the calls of a lease holder) go straight to the pool, where at
// least HolderConns connections are always free or busy with other
// holders: a holder gets one at once unless other holders use the whole
// reserve, and never waits behind the burst of claims, nor behind a claim
// stuck on a row lock. The default reserve
// is a quarter of MaxConns and at least one connection; a holder's
// statements are short, one per heartbeat or completion in flight. A call
// whose context ends while it waits for its turn returns at once, with an
// error that wraps the context's cause and says what it waited for.
//
// A reserve, not a priority queue in front of the whole pool (which is
// what idemsqlite has for its one writer): a queue puts a holder first in
// line for the next free connection, but when every connection is held by
// a claim waiting on a row lock (held by a Process transaction on the same
// key, say) no connection comes free until the lock goes. Only connections
// the claims can never take keep the heartbeats going. Nor a second pool
// the store opens itself: the Store has no Close, and the application's
// pool is the one its operators sized.
//
// Limits:
//
//   - A pool of MaxConns 1 cannot keep a connection back. New logs a
//     warning; claims still queue in the store, so a holder waits behind at
//     most the one claim that has the connection, not behind the burst.
//   - The reserve counts the store's own calls. Process, ProcessBatch, the
//     inbox, Ping and your own queries on the pool are not held back; if
//     they can fill the pool, raise MaxConns by what they use or
//     give the Guard's Store a pool of its own (two Stores may share a
//     schema).
//   - Each Store keeps its own reserve: two Stores over one pool (one per
//     schema, say) can together take all of it.
//
// Heartbeats that fall due together share a statement, and so do
// completions. A process that took many leases in one burst (idem proxy
// under a spike, a consumer's large batch) heartbeats them together every
// Lease/3 and often completes them together; at one statement and one
// commit each, hundreds of them queued on the holders' connections for
// longer than a short lease's heartbeat period. Extends (or Completes)
// that arrive while two statements of their kind are in flight wait and
// go out together, up to 512 in one UPDATE over arrays (completions: up
// to 4 MiB of results), each with its own answer (its new expiry, or
// ErrLeaseLost). A lone call is one statement, sent at once. A caller
// whose context ends stops waiting; the shared statement goes on for the
// others and ends once all of them have stopped waiting (the last of their
// deadlines or cancellations). BenchmarkHolderBurst
// compares it with one statement each.
//
// Size the pool for the statements in flight, not for the requests: a
// claim holds a connection for one or two short statements, a holder for
// one, and nothing holds one while the guarded function runs. pgxpool's
// default, max(4, NumCPU), keeps at least one for holders; idem proxy
// uses 16 unless the DSN sets pool_max_conns. [Store.ConnStats] reports
// how long holders waited for a connection (alert well before the mean
// nears a third of the lease, the heartbeat interval) and how many claims
// wait for theirs.
//
// All expiries (leases, dedupe windows) are computed with PostgreSQL's
// now(), never the application's clock. Fencing tokens come from the
// sequence idem_token_seq, so they keep increasing for a key across Release,
// Delete and Purge. A dedupe record written by Process or ProcessBatch holds
// no lease and so no token (0, as in the other stores); it draws nothing
// from the sequence.
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
// that run schema changes with their own tools. [Store.Ping] reports an
// unreachable server or a schema that is behind ([ErrNotMigrated]); call it
// at start-up. As in every idem store, the constructor ([New]) validates
// its configuration and does no I/O; Ping is what talks to the server.
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
// # Retention at scale
//
// At 100,000 messages a second and a day of retention the table holds
// billions of rows; deleting them row by row costs as much as inserting
// them, and the space goes back to PostgreSQL only with a VACUUM FULL. The
// opt-in partitioned layout retires records by dropping whole tables:
//
//	m, _ := idempgx.NewMigrator(pool, &idempgx.MigratorConfig{Schema: "idem"})
//	err := m.Partition(ctx, &idempgx.PartitionOptions{Interval: time.Hour})
//	store, _ := idempgx.New(pool, &idempgx.Config{Schema: "idem", Partitioned: true})
//	// every few minutes, from any process (or `idem keys maintain`):
//	rep, err := store.Maintain(ctx, nil)
//
// idem_records becomes PARTITION BY LIST (bucket), one table per bucket
// (idem_records_p<n>); new records go to the current bucket, [Store.Maintain]
// moves the writes to a new partition every Interval and drops an older one
// once every record in it expired. Existing users keep the plain table
// (Config.Partitioned false, the default); [Migrator.Partition] switches a
// schema (the old table becomes partition 0, dropped once its records
// expired), and [Store.Ping] refuses a Config that does not match the
// schema ([ErrNotPartitioned]). The conversion rebuilds the primary key of
// the existing rows under a lock: for a large table, partition a new schema
// and point the stores at it once the old one's retention has passed
// (a message then seen in both is processed twice, so drain first), or
// purge first.
//
// A partitioned table's unique key must contain the partition key, so the
// primary key is (scope, key, bucket). (scope, key) stays unique because
// every write that may create a record checks the other partitions for the
// key in the same statement, inserting only when there is none or when the
// row found is one to take over (deleted by that statement), and because
// those writes hold a shared advisory lock that a rotation takes
// exclusively: all writes of the old bucket have ended before any write
// reads the new one, so that check always sees them. The lock is sent in
// the same round trip as the write. Every store semantic is unchanged
// (the conformance suite runs on this layout while the partitions rotate
// under it); fencing tokens still come from the one sequence, so they keep
// increasing across partition drops.
//
// # Listing
//
// [Store.List] implements [idem.Lister] for operators (idem keys list and
// find): it walks the primary key, of the whole table or of one scope, at
// most storekit.ListExamine rows a call, and filters them in Go, so a
// filter on the key alone, a prefix or the scope hash reads the table in
// bounded pages instead of needing an index that every claim would pay for.
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
// from the server has an unknown outcome: its error wraps
// idem.ErrCommitUnknown (consumers requeue rather than acknowledge or count
// an attempt) and is retryable too: retrying a message that did commit is
// harmless, it is then a Duplicate.
// [IsRetryableError] is the classifier.
package idempgx
