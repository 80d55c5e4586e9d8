-- The transactional outbox: producers insert events in their own
-- transactions; relays claim due events with FOR UPDATE SKIP LOCKED, publish
-- them and mark them sent once the broker confirmed. Fencing tokens come
-- from their own sequence.
CREATE SEQUENCE idem_outbox_token_seq AS bigint;

CREATE TABLE idem_outbox (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id        text        NOT NULL UNIQUE,
    topic           text        NOT NULL,
    event_key       text        NOT NULL DEFAULT '',
    payload         bytea       NOT NULL,
    headers         text        NOT NULL DEFAULT '',
    state           text        NOT NULL DEFAULT 'pending'
                                CHECK (state IN ('pending', 'sending', 'sent', 'dead')),
    attempts        integer     NOT NULL DEFAULT 0,
    token           bigint      NOT NULL DEFAULT 0,
    last_error      text,
    dead_reason     text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- For a sending event this is its lease expiry: a crashed relay's batch
    -- becomes due again without a second index or a sweeper.
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_attempt_at timestamptz,
    finished_at     timestamptz
);

-- Claims scan only unfinished events, however many sent and dead ones the
-- table holds; id breaks ties between the events of one transaction.
CREATE INDEX idem_outbox_due_idx ON idem_outbox (next_attempt_at, id)
    WHERE state IN ('pending', 'sending');

-- Ordered claims look for an earlier event of the same key that is not sent.
CREATE INDEX idem_outbox_key_idx ON idem_outbox (event_key, id)
    WHERE state IN ('pending', 'sending', 'dead') AND event_key <> '';

-- Retention deletes sent events by age.
CREATE INDEX idem_outbox_sent_idx ON idem_outbox (finished_at) WHERE state = 'sent';

CREATE INDEX idem_outbox_dead_idx ON idem_outbox (id) WHERE state = 'dead';
