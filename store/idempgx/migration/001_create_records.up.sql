-- idem records: one row per (scope, key), the state machine of the Store
-- contract. Fencing tokens come from one sequence so that they keep
-- increasing for a key even after its row was released, deleted or purged.
CREATE SEQUENCE idem_token_seq AS bigint;

CREATE TABLE idem_records (
    scope            text        NOT NULL,
    key              text        NOT NULL,
    state            text        NOT NULL CHECK (state IN ('in_progress', 'completed')),
    fingerprint      bytea       NOT NULL CHECK (octet_length(fingerprint) = 32),
    -- The default binds the sequence by OID at migration time, so inserts
    -- need no schema-qualified sequence name.
    token            bigint      NOT NULL DEFAULT nextval('idem_token_seq'),
    result           bytea,
    failed           boolean     NOT NULL DEFAULT false,
    tombstone        boolean     NOT NULL DEFAULT false,
    created_at       timestamptz NOT NULL DEFAULT now(),
    lease_expires_at timestamptz,
    completed_at     timestamptz,
    expires_at       timestamptz NOT NULL,
    PRIMARY KEY (scope, key)
);

-- Purge scans by expiry.
CREATE INDEX idem_records_expires_at_idx ON idem_records (expires_at);
