-- Subscriber events, webhook endpoints and the webhook outbox, with the semantics of the
-- PostgreSQL set (migrations/postgres/20261125000200_events_webhooks.tx.up.sql).
CREATE TABLE subscriber_events (
    id            TEXT PRIMARY KEY,
    newsletter_id TEXT      NOT NULL,
    subscriber_id TEXT      NOT NULL REFERENCES subscribers (id) ON DELETE CASCADE,
    type          TEXT      NOT NULL,
    payload       TEXT      NOT NULL,
    traceparent   TEXT      NOT NULL,
    created_at    TIMESTAMP NOT NULL
);

--bun:split

CREATE INDEX subscriber_events_history_idx ON subscriber_events (subscriber_id, id);

--bun:split

CREATE TABLE webhook_endpoints (
    id              TEXT PRIMARY KEY,
    newsletter_id   TEXT      NOT NULL REFERENCES newsletters (id) ON DELETE CASCADE,
    url             TEXT      NOT NULL,
    events          TEXT      NOT NULL,
    secret          TEXT      NOT NULL,
    status          TEXT      NOT NULL CHECK (status IN ('enabled', 'disabled')),
    busy_until      TIMESTAMP NOT NULL,
    last_claimed_at TIMESTAMP NOT NULL,
    failing_since   TIMESTAMP,
    created_at      TIMESTAMP NOT NULL,
    updated_at      TIMESTAMP NOT NULL
);

--bun:split

CREATE INDEX webhook_endpoints_newsletter_idx ON webhook_endpoints (newsletter_id, created_at, id);

--bun:split

CREATE TABLE webhook_deliveries (
    endpoint_id     TEXT      NOT NULL,
    event_id        TEXT      NOT NULL REFERENCES subscriber_events (id) ON DELETE CASCADE,
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

CREATE INDEX webhook_deliveries_endpoint_due_idx ON webhook_deliveries (endpoint_id, next_attempt_at) WHERE state = 'pending';

--bun:split

CREATE INDEX webhook_deliveries_due_idx ON webhook_deliveries (next_attempt_at) WHERE state = 'pending';

--bun:split

CREATE INDEX webhook_deliveries_event_idx ON webhook_deliveries (event_id);
