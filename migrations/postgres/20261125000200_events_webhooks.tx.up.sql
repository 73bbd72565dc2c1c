-- Subscriber events (docs/api-contract.md §10.1): an append-only log written in the same
-- transaction as every change of a subscriber. payload is the event's public JSON object,
-- written once; the history returns it and webhooks deliver it. traceparent links deliveries
-- to the request that caused the event. Ids are UUIDv7, so id order is time order.
CREATE TABLE subscriber_events (
    id            uuid PRIMARY KEY,
    newsletter_id uuid        NOT NULL,
    subscriber_id uuid        NOT NULL REFERENCES subscribers (id) ON DELETE CASCADE,
    type          text        NOT NULL,
    payload       text        NOT NULL,
    traceparent   text        NOT NULL,
    created_at    timestamptz NOT NULL
);

--bun:split

CREATE INDEX subscriber_events_history_idx ON subscriber_events (subscriber_id, id);

--bun:split

-- Webhook endpoints (docs/api-contract.md §10.3). events is the JSON array of subscribed
-- types; secret signs deliveries. busy_until is the lease of the worker delivering to the
-- endpoint (one at a time per endpoint), last_claimed_at the round-robin order among
-- endpoints, failing_since the start of an unbroken run of failed deliveries.
CREATE TABLE webhook_endpoints (
    id              uuid PRIMARY KEY,
    newsletter_id   uuid        NOT NULL REFERENCES newsletters (id) ON DELETE CASCADE,
    url             text        NOT NULL,
    events          text        NOT NULL,
    secret          text        NOT NULL,
    status          text        NOT NULL CHECK (status IN ('enabled', 'disabled')),
    busy_until      timestamptz NOT NULL,
    last_claimed_at timestamptz NOT NULL,
    failing_since   timestamptz,
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL
);

--bun:split

CREATE INDEX webhook_endpoints_newsletter_idx ON webhook_endpoints (newsletter_id, created_at, id);

--bun:split

-- The webhook outbox (docs/api-contract.md §10.4): one row per event and endpoint, queued in
-- the event's transaction, deleted once delivered; failed ones stay for inspection.
-- endpoint_id has no foreign key: its check would take a share lock on the endpoint's row in
-- every write, which the worker's updates of that row then wait for; deleting an endpoint
-- deletes its deliveries itself. The workers poll for due rows (no NOTIFY: a notifying
-- transaction's commit is serialised with every other's).
CREATE TABLE webhook_deliveries (
    endpoint_id     uuid        NOT NULL,
    event_id        uuid        NOT NULL REFERENCES subscriber_events (id) ON DELETE CASCADE,
    state           text        NOT NULL CHECK (state IN ('pending', 'failed')),
    attempts        integer     NOT NULL,
    next_attempt_at timestamptz NOT NULL,
    last_error      text        NOT NULL,
    last_status     integer     NOT NULL,
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    PRIMARY KEY (endpoint_id, event_id)
);

--bun:split

CREATE INDEX webhook_deliveries_endpoint_due_idx ON webhook_deliveries (endpoint_id, next_attempt_at) WHERE state = 'pending';

--bun:split

CREATE INDEX webhook_deliveries_due_idx ON webhook_deliveries (next_attempt_at) WHERE state = 'pending';

--bun:split

CREATE INDEX webhook_deliveries_event_idx ON webhook_deliveries (event_id);
