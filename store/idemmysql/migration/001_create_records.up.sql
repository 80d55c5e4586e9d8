-- idem records: one row per (scope, key), the state machine of the Store
-- contract. Scope and key are VARBINARY so that they compare byte for byte
-- (a _ci collation would make "Key" and "key" one record). Times are UTC
-- wall-clock values from the server's UTC_TIMESTAMP(6), so the session
-- time_zone does not matter.
CREATE TABLE IF NOT EXISTS idem_records (
    scope            VARBINARY(1024) NOT NULL,
    `key`            VARBINARY(255)  NOT NULL,
    state            VARCHAR(16)     NOT NULL,
    fingerprint      BINARY(32)      NOT NULL,
    token            BIGINT          NOT NULL,
    result           LONGBLOB,
    failed           BOOLEAN         NOT NULL DEFAULT FALSE,
    tombstone        BOOLEAN         NOT NULL DEFAULT FALSE,
    created_at       DATETIME(6)     NOT NULL,
    lease_expires_at DATETIME(6),
    completed_at     DATETIME(6),
    expires_at       DATETIME(6)     NOT NULL,
    PRIMARY KEY (scope, `key`),
    -- Purge scans by expiry.
    KEY idem_records_expires_at_idx (expires_at),
    CONSTRAINT idem_records_state_chk CHECK (state IN ('in_progress', 'completed'))
) ENGINE = InnoDB;

-- Fencing tokens: every claim (and every transactional batch) inserts a row
-- and takes its AUTO_INCREMENT id, which InnoDB keeps increasing across
-- deletes and restarts (MySQL 8.0, MariaDB 10.2.4 and later), so tokens keep
-- increasing for a key even after its row was released, deleted or purged.
-- Allocating one takes no row lock that other claims wait on. Purge deletes
-- all but the newest row.
CREATE TABLE IF NOT EXISTS idem_tokens (
    id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY
) ENGINE = InnoDB;
