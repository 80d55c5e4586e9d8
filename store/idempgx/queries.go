package idempgx

import "github.com/jackc/pgx/v5"

// queries holds the store's SQL with the schema-qualified table name built
// once. The only text spliced into SQL is the table identifier, quoted by
// pgx.Identifier.Sanitize; every value is a parameter.
type queries struct {
	claim, getLive, get, complete, release, extend, delete, purge string
	// extendBatch and completeBatch are extend and complete for many
	// leases (see coalesce.go).
	extendBatch, completeBatch                               string
	processOne, processOneNew, processBatch, processBatchNew string
	processLookup                                            string
	// planLookup says to plan processLookup for its arguments on every
	// call rather than cache it (see processLookup).
	planLookup bool
	// processOneFirst is processOneNew with the lookup of the record that
	// stopped the insert folded in (see firstPass).
	processOneFirst    string
	listAll, listScope string
	// lockShared, in the partitioned layout, is the statement sent just
	// before every write that may create a record (see partition.go); empty
	// in the plain layout.
	lockShared string
}

// takeoverCondition says when an existing row counts as absent for an
// insert of a record with fingerprint excluded.fingerprint: a completed
// record past its retention (whatever its fingerprint) or a lease that
// expired for the same content. A lease for other content is a mismatch
// even after it expired.
const takeoverCondition = `(r.state = 'completed' AND r.expires_at <= now())
	OR (r.state = 'in_progress' AND r.lease_expires_at <= now() AND r.fingerprint = excluded.fingerprint)`

func newQueries(schema string, partitioned bool) queries {
	var q queries
	if partitioned {
		q = newPartitionedQueries(schema)
	} else {
		q = newPlainQueries(schema)
	}
	q.processOneFirst = firstPass(pgx.Identifier{schema, "idem_records"}.Sanitize(), q.processOneNew)
	return q
}

// firstPass folds the lookup of the existing record into one, the first
// try's insert (processOneNew), so that a duplicate costs one statement,
// not two. It returns one row: the record's state, fingerprint, live lease
// and expired, state NULL when the statement inserted the record.
//
// The lookup reads the statement's snapshot, which does not hold a record
// that a concurrent transaction committed after the statement began: the
// insert then waited for that transaction, conflicted with its record and
// inserted nothing, and the lookup finds nothing either. The caller looks
// such a message up again with a statement of its own (getLive), whose
// snapshot is newer. A record deleted after the snapshot can be both
// inserted and seen; the insert wins.
//
// ProcessBatch keeps two statements: folded with its lookup, the insert
// was measured slower than the cached insert and a separate lookup, when
// that lookup was a join planned on every call. Its lookup is now a cached
// statement too (processLookup); folding was not measured again.
func firstPass(t, one string) string {
	return `WITH ins AS (` + one + `)
SELECT NULL::text, NULL::bytea, NULL::boolean, NULL::boolean FROM ins
UNION ALL
SELECT r.state, r.fingerprint, coalesce(r.lease_expires_at > now(), false), r.expires_at <= now()
FROM ` + t + ` AS r WHERE r.scope = $1 AND r.key = $2 AND NOT EXISTS (SELECT FROM ins)`
}

func newPlainQueries(schema string) queries {
	t := pgx.Identifier{schema, "idem_records"}.Sanitize()
	// The inserts of a completed dedupe record, for one message and for a
	// batch, and the conflict clause that takes an expired row over.
	// A dedupe record holds no lease, so it takes no fencing token (token
	// 0, as in the other stores): the row costs no nextval, and a later
	// Claim of the key still draws a token above every token issued.
	processOne := `INSERT INTO ` + t + ` AS r (scope, key, state, fingerprint, token, created_at, completed_at, expires_at)
VALUES ($1, $2, 'completed', $3, 0, now(), now(), now() + $4 * interval '1 microsecond')
`
	processBatch := `INSERT INTO ` + t + ` AS r (scope, key, state, fingerprint, token, created_at, completed_at, expires_at)
SELECT u.scope, u.key, 'completed', u.fp, 0, now(), now(), now() + u.ret * interval '1 microsecond'
FROM unnest($1::text[], $2::text[], $3::bytea[], $4::bigint[]) AS u(scope, key, fp, ret)
`
	takeover := `ON CONFLICT (scope, key) DO UPDATE SET ` + processSet + `
WHERE ` + takeoverCondition + `
`
	listAll, listScope := listQueries(t)
	return queries{
		listAll:   listAll,
		listScope: listScope,
		// The token column defaults to nextval of the schema's sequence, so
		// excluded.token is a fresh token also on the update path. created_at
		// survives a takeover, so "created before this statement" tells a
		// takeover from a fresh insert: an expired lease was created at least
		// one microsecond before it expired.
		claim: `INSERT INTO ` + t + ` AS r (scope, key, state, fingerprint, created_at, lease_expires_at, expires_at)
VALUES ($1, $2, 'in_progress', $3, now(), now() + $4 * interval '1 microsecond', now() + $4 * interval '1 microsecond')
ON CONFLICT (scope, key) DO UPDATE SET
	state = 'in_progress', fingerprint = excluded.fingerprint, token = excluded.token,
	result = NULL, failed = false, tombstone = false,
	created_at = CASE WHEN r.state = 'in_progress' THEN r.created_at ELSE excluded.created_at END,
	lease_expires_at = excluded.lease_expires_at, completed_at = NULL, expires_at = excluded.expires_at
WHERE ` + takeoverCondition + `
RETURNING token, lease_expires_at, created_at < now()`,

		getLive: `SELECT ` + recordColumns + `, coalesce(lease_expires_at > now(), false), expires_at <= now()
FROM ` + t + ` WHERE scope = $1 AND key = $2`,

		get: `SELECT ` + recordColumns + ` FROM ` + t + ` WHERE scope = $1 AND key = $2`,

		complete: `UPDATE ` + t + ` SET state = 'completed', result = $4, failed = $5, tombstone = $6,
	lease_expires_at = NULL, completed_at = now(), expires_at = now() + $7 * interval '1 microsecond'
WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_progress'`,

		release: `DELETE FROM ` + t + ` WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_progress'`,

		extend: `UPDATE ` + t + ` SET lease_expires_at = now() + $4 * interval '1 microsecond',
	expires_at = now() + $4 * interval '1 microsecond'
WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_progress'
RETURNING lease_expires_at`,

		completeBatch: `UPDATE ` + t + ` AS r SET state = 'completed', result = u.result, failed = u.failed, tombstone = u.tombstone,
	lease_expires_at = NULL, completed_at = now(), expires_at = now() + u.ret * interval '1 microsecond'
FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bytea[], $5::boolean[], $6::boolean[], $7::bigint[])
	AS u(scope, key, token, result, failed, tombstone, ret)
WHERE r.scope = u.scope AND r.key = u.key AND r.token = u.token AND r.state = 'in_progress'
RETURNING r.scope, r.key, r.token`,

		extendBatch: `UPDATE ` + t + ` AS r SET lease_expires_at = now() + u.lease * interval '1 microsecond',
	expires_at = now() + u.lease * interval '1 microsecond'
FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) AS u(scope, key, token, lease)
WHERE r.scope = u.scope AND r.key = u.key AND r.token = u.token AND r.state = 'in_progress'
RETURNING r.scope, r.key, r.token, r.lease_expires_at`,

		delete: `DELETE FROM ` + t + ` WHERE scope = $1 AND key = $2`,

		// SKIP LOCKED lets a purge run beside live traffic (and beside
		// another purge) without waiting on row locks.
		purge: `DELETE FROM ` + t + ` WHERE ctid = ANY(ARRAY(
	SELECT ctid FROM ` + t + ` WHERE expires_at <= now() LIMIT $1 FOR UPDATE SKIP LOCKED))`,

		processOne: processOne + takeover + `RETURNING true`,
		// processOneNew is processOne for the first try: a duplicate takes
		// no row lock (see processBatchNew).
		processOneNew: processOne + `ON CONFLICT (scope, key) DO NOTHING
RETURNING true`,

		// The input arrays are sorted by (scope, key) so that concurrent
		// batches lock rows in the same order and cannot deadlock.
		processBatch: processBatch + takeover + `RETURNING r.scope, r.key`,
		// processBatchNew is processBatch for a batch's first pass: it
		// leaves existing rows alone. ON CONFLICT DO UPDATE locks every
		// conflicting row, even one its WHERE then keeps, and a duplicate
		// is the usual conflict: each would cost a row lock (a heap write
		// and WAL) held to the end of the transaction, and concurrent
		// batches that met the same old key would wait on each other. The
		// rare rows to take over (expired, abandoned) go through
		// processBatch on the next pass.
		processBatchNew: processBatch + `ON CONFLICT (scope, key) DO NOTHING
RETURNING r.scope, r.key`,

		// processLookup probes the primary key once per input key. The
		// LIMIT keeps the planner from flattening the subquery into a join
		// of its own choosing: a join's generic plan (the one cached with
		// the statement after five runs) hash-joins a sequential scan of
		// the table while it holds up to a few thousand rows, and keeps it
		// as the table grows until the next ANALYZE replans it. This
		// shape's generic plan probes the index unless the table fits in
		// about three pages (some 200 records) when the plan is made: a
		// young table's window, closed by its first autoanalyze, as for
		// every other cached statement of the store. The partitioned
		// layout plans it on every call instead (planLookup): each
		// rotation makes an empty partition the current one, and a plan
		// made then would scan it while it fills. At most one row
		// matches a key, also in the partitioned layout.
		processLookup: `SELECT u.scope, u.key, r.state, r.fingerprint, r.live, r.expired
FROM unnest($1::text[], $2::text[]) AS u(scope, key)
CROSS JOIN LATERAL (SELECT r.state, r.fingerprint, coalesce(r.lease_expires_at > now(), false) AS live, r.expires_at <= now() AS expired
	FROM ` + t + ` AS r WHERE r.scope = u.scope AND r.key = u.key LIMIT 1) AS r`,
	}
}

// processSet replaces an expired row with a fresh completed dedupe record.
const processSet = `state = 'completed', fingerprint = excluded.fingerprint, token = excluded.token,
	result = NULL, failed = false, tombstone = false, created_at = excluded.created_at,
	lease_expires_at = NULL, completed_at = excluded.completed_at, expires_at = excluded.expires_at`
