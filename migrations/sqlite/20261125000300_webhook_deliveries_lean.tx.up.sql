-- The same lean webhook outbox as on PostgreSQL (see its migration of this name): no foreign
-- key to subscriber_events and only the primary key and the per-endpoint due index. SQLite
-- drops a foreign key by rebuilding the table.
CREATE TABLE webhook_deliveries_lean (
    endpoint_id     TEXT      NOT NULL,
    event_id        TEXT      NOT NULL,
    state           TEXT      NOT NULL CHECK (state IN ('pending', 'failed')),
    attempts        INTEGER   NOT NULL,
    next_attempt_at TIMESTAMP NOT NULL,
    last_error      TEXT      NOT NULL,
    last_status     INTEGER   NOT NULL,
    created_at      TIMESTAMP NOT NULL,
    updated_at      TIMESTAMP NOT NULL,
    PRIMARY KEY (endpoint_id, event_id)
) WITHOUT ROWID;

--bun:split

INSERT INTO webhook_deliveries_lean SELECT endpoint_id, event_id, state, attempts, next_attempt_at,
    last_error, last_status, created_at, updated_at FROM webhook_deliveries;

--bun:split

DROP TABLE webhook_deliveries;

--bun:split

ALTER TABLE webhook_deliveries_lean RENAME TO webhook_deliveries;

--bun:split

CREATE INDEX webhook_deliveries_endpoint_due_idx ON webhook_deliveries (endpoint_id, next_attempt_at) WHERE state = 'pending';
