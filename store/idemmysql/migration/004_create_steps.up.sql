-- idem steps: the recovery points of multi-step operations (idem.Steps),
-- one row per recorded step of an operation (scope, key). They live apart
-- from idem_records because they must survive Release and takeover; each
-- step write locks the record row (FOR UPDATE) and checks its token in the
-- same transaction. A result is at most 64 KiB (idem.MaxStepResultBytes),
-- one byte more than a BLOB holds.
CREATE TABLE IF NOT EXISTS idem_steps (
    scope       VARBINARY(1024) NOT NULL,
    `key`       VARBINARY(255)  NOT NULL,
    name        VARBINARY(64)   NOT NULL,
    seq         INT             NOT NULL,
    fingerprint BINARY(32)      NOT NULL,
    token       BIGINT          NOT NULL,
    result      MEDIUMBLOB,
    tombstone   BOOLEAN         NOT NULL DEFAULT FALSE,
    created_at  DATETIME(6)     NOT NULL,
    expires_at  DATETIME(6)     NOT NULL,
    PRIMARY KEY (scope, `key`, name),
    -- Purge scans by expiry.
    KEY idem_steps_expires_at_idx (expires_at)
) ENGINE = InnoDB;
