-- The inbox: messages written on receipt (the broker is acked at once) and
-- processed later by workers that claim due rows in BEGIN IMMEDIATE
-- transactions. Times are unix microseconds read from the process clock.
CREATE TABLE idem_inbox (
    -- AUTOINCREMENT: ids are never reused after a purge, so id order is
    -- receive order, which ordered mode relies on.
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    source          TEXT    NOT NULL,
    message_id      TEXT    NOT NULL,
    type            TEXT    NOT NULL,
    payload         BLOB    NOT NULL,
    ordering_key    TEXT    NOT NULL DEFAULT '',
    fingerprint     BLOB    NOT NULL CHECK (length(fingerprint) = 32),
    state           TEXT    NOT NULL DEFAULT 'pending'
                            CHECK (state IN ('pending', 'running', 'processed', 'dead')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    token           INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT,
    dead_reason     TEXT,
    received_at     INTEGER NOT NULL,
    -- For a running row this is its lease expiry: a crashed worker's row
    -- becomes due again through the same index.
    next_attempt_at INTEGER NOT NULL,
    processed_at    INTEGER,
    UNIQUE (source, message_id)
);

CREATE INDEX idem_inbox_due_idx ON idem_inbox (next_attempt_at, id)
    WHERE state IN ('pending', 'running');

CREATE INDEX idem_inbox_ordering_idx ON idem_inbox (ordering_key, id)
    WHERE state IN ('pending', 'running') AND ordering_key <> '';

CREATE INDEX idem_inbox_processed_idx ON idem_inbox (processed_at)
    WHERE state = 'processed';

CREATE INDEX idem_inbox_state_idx ON idem_inbox (state, id);

-- Every failed run, kept with the row (dead rows keep their whole history).
CREATE TABLE idem_inbox_attempts (
    inbox_id INTEGER NOT NULL REFERENCES idem_inbox (id) ON DELETE CASCADE,
    attempt  INTEGER NOT NULL,
    at       INTEGER NOT NULL,
    error    TEXT    NOT NULL,
    PRIMARY KEY (inbox_id, attempt)
) WITHOUT ROWID;

-- Fencing tokens for inbox claims, bumped inside the claiming transaction.
CREATE TABLE idem_inbox_token_counter (
    id    INTEGER PRIMARY KEY CHECK (id = 1),
    value INTEGER NOT NULL
);
INSERT INTO idem_inbox_token_counter (id, value) VALUES (1, 0);
