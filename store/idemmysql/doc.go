// Package idemmysql is the MySQL and MariaDB store for idem, over the
// application's own [*sql.DB] of github.com/go-sql-driver/mysql.
//
// It offers two paths over one table, idem_records, keyed by (scope, key),
// in the database the *sql.DB connects to:
//
//   - the lease path: [Store] implements [idem.Store], so [idem.Guard], the
//     HTTP middleware and the proxy can run on it;
//   - the transactional path: [Store.Process] and [Store.ProcessBatch] (and
//     their Tx variants) write the dedupe record in the same transaction as
//     the business effect. Store implements [idem.Processor] with *sql.Tx,
//     so every broker adapter accepts it.
//
// [Store.Inbox] is the inbox on the same database: an
// [inboxdriver.Backend] whose handlers get the *sql.Tx that marks their
// message processed.
//
// # Connecting
//
//	cfg, err := idemmysql.ParseURL("mysql://app:secret@db:3306/orders") // or mysql.ParseDSN
//	connector, err := mysql.NewConnector(cfg)
//	db := sql.OpenDB(connector)
//	store, err := idemmysql.New(db, nil) // no I/O
//	err = store.Ping(ctx)                // server version, schema migrated
//
// Migrate with [NewMigrator] (or `idem migrate up --store mysql://…`). The
// store needs no DSN option: it reads and writes times as UTC text, so
// parseTime and loc do not matter, and it runs every migration statement on
// its own, so multiStatements is not needed. interpolateParams=true
// ([ParseURL] sets it) saves two round trips per statement: without it the
// driver prepares, executes and closes a server-side statement each time.
//
// # Process versus Guard
//
// Use Process when the effect is a write to the same database:
//
//	res, err := store.Process(ctx, idem.Message{Scope: "billing", Key: msgID, Fingerprint: fp},
//		func(ctx context.Context, tx *sql.Tx) error {
//			_, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = balance + ? WHERE id = ?", amount, id)
//			return err
//		})
//
// The dedupe row and the effect commit together or not at all. The row is
// written with a plain INSERT: a duplicate key (1062) is the one error
// expected, InnoDB rolls back only that statement, and the existing row is
// then read with LOCK IN SHARE MODE and judged (Duplicate, Mismatch, or an
// expired record to take over). A concurrent duplicate waits on the unique
// key until the first transaction ends, then sees its outcome. INSERT
// IGNORE is never used: it would also turn truncation and foreign-key
// errors into warnings.
//
// [Store.ProcessBatch] records a whole batch with one multi-row INSERT … ON
// DUPLICATE KEY UPDATE token = token, which inserts the new keys and leaves
// existing rows unchanged (only locked), then one read of all the keys: the
// rows that carry the batch's fresh fencing token are the ones it inserted,
// and only those messages are handed to the handler. Keys are sorted so
// that concurrent batches lock rows in one order. At most [MaxBatch]
// messages, for MySQL's 65,535 placeholders per statement.
//
// Use an [idem.Guard] over the Store when the effect is outside the
// database. A claim that cannot acquire (held, completed, mismatched) is
// answered from one plain read; a claim that may acquire takes a short
// READ COMMITTED transaction: a fencing token, the row under FOR UPDATE,
// then an insert or a takeover.
//
// # Clock, tokens, retention
//
// Every time is the server's UTC_TIMESTAMP(6), stored in DATETIME(6)
// columns: leases and retention are measured by one clock, whatever the
// application hosts' clocks and the session time_zone say. Fencing tokens
// are AUTO_INCREMENT ids of the idem_tokens table (idem_inbox_tokens for
// the inbox): allocating one takes no lock that other claims wait on, and
// the counter never goes back, across deletes and restarts. [Store.Purge]
// deletes expired records in batches of short transactions that lock with
// FOR UPDATE SKIP LOCKED, so it never waits on a claim, and drops the spent
// token rows.
//
// # Errors
//
// Deadlocks (1213), lock wait timeouts (1205), lost or refused connections,
// a server shutting down or killing the connection, and a server that is
// read-only (1290, 1792, 1836: a failover in progress) are marked with
// [idem.Retryable] ([IsRetryableError] is the classifier). Every other
// server error is not. A COMMIT whose answer was lost returns an error
// wrapping [idem.ErrCommitUnknown]. Process and ProcessBatch run the
// attempt again after a deadlock that happened before the handler ran;
// the handler never runs twice in one call.
//
// # MariaDB and MySQL 8
//
// The tests run against MariaDB 10.11 (the CI machine's Debian package);
// the SQL is the common dialect of MariaDB 10.6+ and MySQL 8.0+, which
// [Store.Ping] and the Migrator check for ([CheckServerVersion]): both are
// the first releases with FOR UPDATE SKIP LOCKED, which the inbox's claims
// and Purge need. The differences that matter:
//
//   - SKIP LOCKED: MariaDB has it from 10.6, MySQL from 8.0. Older servers
//     are refused with a message naming the release needed.
//   - Shared locks: MySQL 8 spells them FOR SHARE, MariaDB only LOCK IN
//     SHARE MODE, which MySQL 8 still accepts; the store uses the latter.
//   - Isolation: both default to REPEATABLE READ, whose gap locks make
//     concurrent inserts into one gap deadlock. The store's own
//     transactions run at READ COMMITTED; a transaction you hand to
//     ProcessTx works at either level (the existing row is read with a
//     locking read, which sees the newest committed version), but READ
//     COMMITTED deadlocks less.
//   - Timestamp precision: DATETIME(6) and UTC_TIMESTAMP(6) keep
//     microseconds on both (MySQL before 5.6.4 and MariaDB before 5.3 had
//     seconds only). TIMESTAMP columns would follow the session time_zone
//     and end in 2038; the store uses DATETIME.
//   - AUTO_INCREMENT: both keep the counter across restarts (MySQL from
//     8.0, MariaDB from 10.2.4); before, it restarted at MAX(id)+1, which
//     is why Purge keeps the newest token row.
//   - Generated columns and CHECK constraints, which the migrations use,
//     are enforced by both.
//
// MySQL commits DDL implicitly, so a migration is not one transaction; see
// [Migrator].
//
// # Lease holders go first
//
// A Guard's heartbeat (Extend) must reach the server within its lease.
// database/sql hands connections out in its own order, so a burst of
// claims, or claims waiting on a row lock, could hold every connection
// while a heartbeat waits. As in idempgx, Claim, Get, Delete and Purge use
// at most SetMaxOpenConns - Config.HolderConns connections at once and
// queue for them in Go; Extend, Complete and Release go straight to the
// pool, where HolderConns connections are always left for them
// ([Store.ConnStats] shows the waits). The limit is read when [New] runs:
// set SetMaxOpenConns first. A pool without a limit needs no reserve.
//
// A process that holds many leases heartbeats them together and completes
// them in bursts, so Extends, and Completes, that arrive while two of their
// kind are in flight are sent as groups of up to 512 (as in idempgx; see
// [storekit.Coalescer]); a lone call is still its own statements, sent at
// once. A group of heartbeats is one UPDATE joined (STRAIGHT_JOIN, by the
// primary key) to a derived table of its leases, a UNION ALL of one row
// each, then one SELECT through the same join to read each lease's new
// expiry back. A group of completions (up to 4 MiB of results) is one READ
// COMMITTED transaction: its records locked with SELECT … FOR UPDATE in key
// order, each lease checked in Go, one joined UPDATE, one commit; a group
// the server rolls back as a deadlock victim runs again. Each call gets its
// own answer, and a group's statements end when the last of its callers'
// contexts ends.
package idemmysql
