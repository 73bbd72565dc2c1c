-- Bulk actions, with the semantics of the PostgreSQL set
-- (migrations/postgres/20261203000200_bulk_actions.tx.up.sql).
CREATE TABLE bulk_actions (
    id            TEXT PRIMARY KEY,
    newsletter_id TEXT      NOT NULL REFERENCES newsletters (id) ON DELETE CASCADE,
    action        TEXT      NOT NULL CHECK (action IN ('add_tags', 'remove_tags', 'set_attributes', 'unsubscribe')),
    tags          TEXT      NOT NULL,
    attributes    TEXT      NOT NULL,
    target        TEXT      NOT NULL,
    state         TEXT      NOT NULL CHECK (state IN ('queued', 'running', 'completed', 'cancelled')),
    key_prefix    TEXT      NOT NULL,
    traceparent   TEXT      NOT NULL,
    staged        BOOLEAN   NOT NULL DEFAULT 0,
    matched       INTEGER   NOT NULL DEFAULT 0,
    processed     INTEGER   NOT NULL DEFAULT 0,
    changed       INTEGER   NOT NULL DEFAULT 0,
    unchanged     INTEGER   NOT NULL DEFAULT 0,
    claim         TEXT,
    lease_until   TIMESTAMP,
    created_at    TIMESTAMP NOT NULL,
    updated_at    TIMESTAMP NOT NULL,
    started_at    TIMESTAMP,
    finished_at   TIMESTAMP
);

--bun:split

CREATE INDEX bulk_actions_list_idx ON bulk_actions (newsletter_id, created_at DESC, id DESC);

--bun:split

CREATE INDEX bulk_actions_due_idx ON bulk_actions (created_at, id) WHERE state IN ('queued', 'running');

--bun:split

CREATE UNIQUE INDEX bulk_actions_one_running_idx ON bulk_actions (newsletter_id) WHERE state = 'running';

--bun:split

CREATE TABLE bulk_action_targets (
    action_id     TEXT    NOT NULL,
    n             INTEGER NOT NULL,
    subscriber_id TEXT    NOT NULL,
    PRIMARY KEY (action_id, n)
) WITHOUT ROWID;
