-- The transactional outbox: producers insert events in their own
-- transactions; relays claim due events with FOR UPDATE SKIP LOCKED
-- (MariaDB 10.6, MySQL 8.0), publish them and mark them sent once the
-- broker confirmed. MySQL has no partial indexes: the generated columns
-- due_at and open_key are NULL for finished events, so their indexes serve
-- the claims however many sent and dead events there are.
CREATE TABLE IF NOT EXISTS idem_outbox (
    id              BIGINT          NOT NULL AUTO_INCREMENT PRIMARY KEY,
    event_id        VARBINARY(255)  NOT NULL,
    topic           VARBINARY(1024) NOT NULL,
    event_key       VARBINARY(255)  NOT NULL DEFAULT '',
    payload         LONGBLOB        NOT NULL,
    headers         TEXT            NOT NULL,
    state           VARCHAR(16)     NOT NULL DEFAULT 'pending',
    attempts        INT             NOT NULL DEFAULT 0,
    token           BIGINT          NOT NULL DEFAULT 0,
    last_error      TEXT,
    dead_reason     TEXT,
    created_at      DATETIME(6)     NOT NULL,
    -- For a sending event this is its lease expiry.
    next_attempt_at DATETIME(6)     NOT NULL,
    last_attempt_at DATETIME(6),
    finished_at     DATETIME(6),
    due_at          DATETIME(6) AS (IF(state IN ('pending', 'sending'), next_attempt_at, NULL)) STORED,
    -- An event holds its key back until it is sent (dead ones too).
    open_key        VARBINARY(255) AS (IF(state <> 'sent' AND event_key <> '', event_key, NULL)) STORED,
    UNIQUE KEY idem_outbox_event_idx (event_id),
    KEY idem_outbox_due_idx (due_at, id),
    KEY idem_outbox_key_idx (open_key, id),
    KEY idem_outbox_state_idx (state, finished_at),
    KEY idem_outbox_state_id_idx (state, id),
    CONSTRAINT idem_outbox_state_chk CHECK (state IN ('pending', 'sending', 'sent', 'dead'))
) ENGINE = InnoDB;

-- Fencing tokens for outbox claims (one per claim), as idem_tokens.
CREATE TABLE IF NOT EXISTS idem_outbox_tokens (
    id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY
) ENGINE = InnoDB;
