-- idem steps: the recovery points of multi-step operations (idem.Steps),
-- one row per recorded step of an operation (scope, key). They live apart
-- from idem_records because they must survive Release and takeover; each
-- step write locks the record row (FOR UPDATE) and checks its token in the
-- same transaction.
CREATE TABLE idem_steps (
    scope       text        NOT NULL,
    key         text        NOT NULL,
    name        text        NOT NULL,
    seq         integer     NOT NULL,
    fingerprint bytea       NOT NULL CHECK (octet_length(fingerprint) = 32),
    token       bigint      NOT NULL,
    result      bytea,
    tombstone   boolean     NOT NULL DEFAULT false,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (scope, key, name)
);

-- Purge scans by expiry.
CREATE INDEX idem_steps_expires_at_idx ON idem_steps (expires_at);
