-- The inbox: messages written on receipt (the broker is acked at once) and
-- processed later by workers that claim due rows with FOR UPDATE SKIP
-- LOCKED (MariaDB 10.6, MySQL 8.0). MySQL has no partial indexes: the
-- generated columns due_at and open_key are NULL for finished rows, so their
-- indexes serve the claims however many processed and dead rows there are.
CREATE TABLE IF NOT EXISTS idem_inbox (
    id              BIGINT          NOT NULL AUTO_INCREMENT PRIMARY KEY,
    source          VARBINARY(1024) NOT NULL,
    message_id      VARBINARY(255)  NOT NULL,
    type            VARBINARY(255)  NOT NULL,
    payload         LONGBLOB        NOT NULL,
    ordering_key    VARBINARY(255)  NOT NULL DEFAULT '',
    fingerprint     BINARY(32)      NOT NULL,
    state           VARCHAR(16)     NOT NULL DEFAULT 'pending',
    attempts        INT             NOT NULL DEFAULT 0,
    token           BIGINT          NOT NULL DEFAULT 0,
    last_error      TEXT,
    dead_reason     TEXT,
    received_at     DATETIME(6)     NOT NULL,
    -- For a running row this is its lease expiry: a crashed worker's row
    -- becomes due again without a second index or a sweeper.
    next_attempt_at DATETIME(6)     NOT NULL,
    processed_at    DATETIME(6),
    due_at          DATETIME(6) AS (IF(state IN ('pending', 'running'), next_attempt_at, NULL)) STORED,
    open_key        VARBINARY(255) AS (IF(state IN ('pending', 'running') AND ordering_key <> '', ordering_key, NULL)) STORED,
    UNIQUE KEY idem_inbox_message_idx (source, message_id),
    -- Claims: the oldest due unfinished rows, in index order.
    KEY idem_inbox_due_idx (due_at, id),
    -- Ordered mode looks for an earlier unfinished row of the same key.
    KEY idem_inbox_ordering_idx (open_key, id),
    -- Retention deletes processed rows by age; the admin lists by state.
    KEY idem_inbox_state_idx (state, processed_at),
    KEY idem_inbox_state_id_idx (state, id),
    CONSTRAINT idem_inbox_state_chk CHECK (state IN ('pending', 'running', 'processed', 'dead'))
) ENGINE = InnoDB;

-- Every failed run, kept with the row (dead rows keep their whole history).
CREATE TABLE IF NOT EXISTS idem_inbox_attempts (
    inbox_id BIGINT      NOT NULL,
    attempt  INT         NOT NULL,
    at       DATETIME(6) NOT NULL,
    error    TEXT        NOT NULL,
    PRIMARY KEY (inbox_id, attempt),
    CONSTRAINT idem_inbox_attempts_inbox_fk FOREIGN KEY (inbox_id) REFERENCES idem_inbox (id) ON DELETE CASCADE
) ENGINE = InnoDB;

-- Fencing tokens for inbox claims (one per claim), as idem_tokens.
CREATE TABLE IF NOT EXISTS idem_inbox_tokens (
    id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY
) ENGINE = InnoDB;
