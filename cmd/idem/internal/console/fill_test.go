package console_test

import (
	"context"
	"fmt"
	"time"

	"github.com/idem-go/idem/store/idemsqlite"
	"github.com/jackc/pgx/v5/pgxpool"
)

// fillSQLite inserts n completed records (keys k0000000…) of scope into
// s in one statement: what takes a million claims and completions one by
// one takes seconds this way.
func fillSQLite(ctx context.Context, s *idemsqlite.Store, scope string, n int) error {
	now := time.Now().UnixMicro()
	_, err := s.DB().ExecContext(ctx, `WITH RECURSIVE seq(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM seq WHERE i < ? - 1)
INSERT INTO idem_records (scope, key, state, fingerprint, token, result, failed, tombstone, created_at, lease_expires_at, completed_at, expires_at)
SELECT ?, printf('k%07d', i), 'completed', zeroblob(32), i + 1, NULL, 0, 0, ?, NULL, ?, ? FROM seq`,
		n, scope, now, now, now+int64(24*time.Hour/time.Microsecond))
	if err != nil {
		return fmt.Errorf("fill sqlite: %w", err)
	}
	return nil
}

// fillPostgres is fillSQLite for PostgreSQL, in schema.
func fillPostgres(ctx context.Context, pool *pgxpool.Pool, schema, scope string, n int) error {
	_, err := pool.Exec(ctx, `INSERT INTO `+schema+`.idem_records (scope, key, state, fingerprint, result, created_at, completed_at, expires_at)
SELECT $1, 'k' || lpad(i::text, 7, '0'), 'completed', decode(repeat('00', 32), 'hex'), NULL, now(), now(), now() + interval '1 day'
FROM generate_series(0, $2::int - 1) AS i`, scope, n)
	if err != nil {
		return fmt.Errorf("fill postgres: %w", err)
	}
	return nil
}
