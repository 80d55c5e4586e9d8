-- The inbox: messages written on receipt (the broker is acked at once) and
-- processed later by workers that claim due rows with FOR UPDATE SKIP
-- LOCKED. Fencing tokens come from their own sequence.
CREATE SEQUENCE idem_inbox_token_seq AS bigint;

CREATE TABLE idem_inbox (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source           text        NOT NULL,
    message_id       text        NOT NULL,
    type             text        NOT NULL,
    payload          bytea       NOT NULL,
    ordering_key     text        NOT NULL DEFAULT '',
    fingerprint      bytea       NOT NULL CHECK (octet_length(fingerprint) = 32),
    state            text        NOT NULL DEFAULT 'pending'
                                 CHECK (state IN ('pending', 'running', 'processed', 'dead')),
    attempts         integer     NOT NULL DEFAULT 0,
    token            bigint      NOT NULL DEFAULT 0,
    last_error       text,
    dead_reason      text,
    received_at      timestamptz NOT NULL DEFAULT now(),
    -- For a running row this is its lease expiry: a crashed worker's row
    -- becomes due again without a second index or a sweeper.
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    processed_at     timestamptz,
    UNIQUE (source, message_id)
);

-- Claims scan only unfinished rows, however many processed and dead rows the
-- table holds. The id column makes the claim's ORDER BY an index order even
-- when thousands of rows share one time (a batch received in one
-- transaction gets one now()).
CREATE INDEX idem_inbox_due_idx ON idem_inbox (next_attempt_at, id)
    WHERE state IN ('pending', 'running');

-- Ordered mode looks for an earlier unfinished row of the same key.
CREATE INDEX idem_inbox_ordering_idx ON idem_inbox (ordering_key, id)
    WHERE state IN ('pending', 'running') AND ordering_key <> '';

-- Retention deletes processed rows by age.
CREATE INDEX idem_inbox_processed_idx ON idem_inbox (processed_at)
    WHERE state = 'processed';

CREATE INDEX idem_inbox_dead_idx ON idem_inbox (id) WHERE state = 'dead';

-- Every failed run, kept with the row (dead rows keep their whole history).
CREATE TABLE idem_inbox_attempts (
    inbox_id bigint      NOT NULL REFERENCES idem_inbox (id) ON DELETE CASCADE,
    attempt  integer     NOT NULL,
    at       timestamptz NOT NULL DEFAULT now(),
    error    text        NOT NULL,
    PRIMARY KEY (inbox_id, attempt)
);
