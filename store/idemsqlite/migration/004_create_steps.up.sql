-- idem steps: the recovery points of multi-step operations (idem.Steps),
-- one row per recorded step of an operation (scope, key). They live apart
-- from idem_records because they must survive Release and takeover; each
-- step write is fenced by the record's token in the same transaction.
-- Times are unix microseconds read from the process clock.
CREATE TABLE idem_steps (
    scope       TEXT    NOT NULL,
    key         TEXT    NOT NULL,
    name        TEXT    NOT NULL,
    seq         INTEGER NOT NULL,
    fingerprint BLOB    NOT NULL CHECK (length(fingerprint) = 32),
    token       INTEGER NOT NULL,
    result      BLOB,
    tombstone   INTEGER NOT NULL DEFAULT 0,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    PRIMARY KEY (scope, key, name)
) WITHOUT ROWID;

-- Purge scans by expiry.
CREATE INDEX idem_steps_expires_at_idx ON idem_steps (expires_at);
