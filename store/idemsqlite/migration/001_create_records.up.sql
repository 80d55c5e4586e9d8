-- idem records: one row per (scope, key), the state machine of the Store
-- contract. Times are unix microseconds read from the process clock.
CREATE TABLE idem_records (
    scope            TEXT    NOT NULL,
    key              TEXT    NOT NULL,
    state            TEXT    NOT NULL CHECK (state IN ('in_progress', 'completed')),
    fingerprint      BLOB    NOT NULL CHECK (length(fingerprint) = 32),
    token            INTEGER NOT NULL,
    result           BLOB,
    failed           INTEGER NOT NULL DEFAULT 0,
    tombstone        INTEGER NOT NULL DEFAULT 0,
    created_at       INTEGER NOT NULL,
    lease_expires_at INTEGER,
    completed_at     INTEGER,
    expires_at       INTEGER NOT NULL,
    PRIMARY KEY (scope, key)
) WITHOUT ROWID;

-- Purge scans by expiry.
CREATE INDEX idem_records_expires_at_idx ON idem_records (expires_at);

-- One global counter for fencing tokens, bumped inside the claiming
-- transaction, so tokens keep increasing for a key even after its row was
-- released, deleted or purged.
CREATE TABLE idem_token_counter (
    id    INTEGER PRIMARY KEY CHECK (id = 1),
    value INTEGER NOT NULL
);
INSERT INTO idem_token_counter (id, value) VALUES (1, 0);
