-- The transactional outbox: producers insert events in their own
-- transactions; relays claim due events in BEGIN IMMEDIATE transactions,
-- publish them and mark them sent once the broker confirmed. Times are unix
-- microseconds read from the process clock.
CREATE TABLE idem_outbox (
    -- AUTOINCREMENT: ids are never reused after a purge, so id order is
    -- write order, which ordered claims rely on.
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id        TEXT    NOT NULL UNIQUE,
    topic           TEXT    NOT NULL,
    event_key       TEXT    NOT NULL DEFAULT '',
    payload         BLOB    NOT NULL,
    headers         TEXT    NOT NULL DEFAULT '',
    state           TEXT    NOT NULL DEFAULT 'pending'
                            CHECK (state IN ('pending', 'sending', 'sent', 'dead')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    token           INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT,
    dead_reason     TEXT,
    created_at      INTEGER NOT NULL,
    -- For a sending event this is its lease expiry.
    next_attempt_at INTEGER NOT NULL,
    last_attempt_at INTEGER,
    finished_at     INTEGER
);

CREATE INDEX idem_outbox_due_idx ON idem_outbox (next_attempt_at, id)
    WHERE state IN ('pending', 'sending');

CREATE INDEX idem_outbox_key_idx ON idem_outbox (event_key, id)
    WHERE state IN ('pending', 'sending', 'dead') AND event_key <> '';

CREATE INDEX idem_outbox_sent_idx ON idem_outbox (finished_at) WHERE state = 'sent';

CREATE INDEX idem_outbox_state_idx ON idem_outbox (state, id);

-- Fencing tokens for outbox claims, bumped inside the claiming transaction.
CREATE TABLE idem_outbox_token_counter (
    id    INTEGER PRIMARY KEY CHECK (id = 1),
    value INTEGER NOT NULL
);
INSERT INTO idem_outbox_token_counter (id, value) VALUES (1, 0);
