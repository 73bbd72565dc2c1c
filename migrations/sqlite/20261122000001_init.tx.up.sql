-- The whole schema of subscriberd on SQLite, with the semantics of the PostgreSQL set
-- (migrations/postgres): ids are UUID text and timestamps are text, both written by the
-- service ('YYYY-MM-DD HH:MM:SS.ffffff+00:00', always UTC, so text order is time order).

CREATE TABLE newsletters (
    id         TEXT PRIMARY KEY,
    name       TEXT      NOT NULL,
    api_access BOOLEAN   NOT NULL,
    created_at TIMESTAMP NOT NULL,
    updated_at TIMESTAMP NOT NULL
);

--bun:split

CREATE TABLE api_keys (
    id            TEXT PRIMARY KEY,
    newsletter_id TEXT      NOT NULL REFERENCES newsletters (id) ON DELETE CASCADE,
    prefix        TEXT      NOT NULL,
    hash          BLOB      NOT NULL UNIQUE,
    label         TEXT      NOT NULL,
    created_at    TIMESTAMP NOT NULL,
    revoked_at    TIMESTAMP
);

--bun:split

CREATE INDEX api_keys_newsletter_id_idx ON api_keys (newsletter_id);

--bun:split

-- email is stored as given (trimmed); email_key is its case-folded form, computed by the
-- service, and is what uniqueness is judged on. SQLite names no constraint in its errors:
-- repo recognises this one by its columns, "subscribers.newsletter_id, subscribers.email_key".
CREATE TABLE subscribers (
    id            TEXT PRIMARY KEY,
    newsletter_id TEXT      NOT NULL REFERENCES newsletters (id) ON DELETE CASCADE,
    email         TEXT      NOT NULL,
    email_key     TEXT      NOT NULL,
    first_name    TEXT      NOT NULL,
    last_name     TEXT      NOT NULL,
    status        TEXT      NOT NULL CHECK (status IN ('active', 'pending', 'unsubscribed')),
    created_at    TIMESTAMP NOT NULL,
    updated_at    TIMESTAMP NOT NULL,
    UNIQUE (newsletter_id, email_key)
);

--bun:split

CREATE INDEX subscribers_list_idx ON subscribers (newsletter_id, created_at DESC, id DESC);

--bun:split

CREATE INDEX subscribers_status_list_idx ON subscribers (newsletter_id, status, created_at DESC, id DESC);

--bun:split

-- Exact subscriber totals per newsletter and status, kept in the same transaction as every
-- change by the row triggers below. SQLite serialises writers, so one row per newsletter and
-- status is enough (PostgreSQL spreads them over slots).
CREATE TABLE subscriber_counts (
    newsletter_id TEXT    NOT NULL REFERENCES newsletters (id) ON DELETE CASCADE,
    status        TEXT    NOT NULL,
    n             INTEGER NOT NULL,
    PRIMARY KEY (newsletter_id, status)
) WITHOUT ROWID;

--bun:split

CREATE TRIGGER subscribers_count_insert AFTER INSERT ON subscribers
BEGIN
    INSERT INTO subscriber_counts (newsletter_id, status, n) VALUES (NEW.newsletter_id, NEW.status, 1)
    ON CONFLICT (newsletter_id, status) DO UPDATE SET n = n + 1;
END;

--bun:split

CREATE TRIGGER subscribers_count_update AFTER UPDATE OF newsletter_id, status ON subscribers
WHEN OLD.newsletter_id IS NOT NEW.newsletter_id OR OLD.status IS NOT NEW.status
BEGIN
    UPDATE subscriber_counts SET n = n - 1
    WHERE newsletter_id = OLD.newsletter_id AND status = OLD.status;
    INSERT INTO subscriber_counts (newsletter_id, status, n) VALUES (NEW.newsletter_id, NEW.status, 1)
    ON CONFLICT (newsletter_id, status) DO UPDATE SET n = n + 1;
END;

--bun:split

CREATE TRIGGER subscribers_count_delete AFTER DELETE ON subscribers
BEGIN
    UPDATE subscriber_counts SET n = n - 1
    WHERE newsletter_id = OLD.newsletter_id AND status = OLD.status;
END;

--bun:split

-- The transactional outbox of confirmation emails. A row holds no secret: the worker makes the
-- token when it sends. traceparent links the send to the request that queued it.
CREATE TABLE email_outbox (
    id              TEXT PRIMARY KEY,
    newsletter_id   TEXT      NOT NULL REFERENCES newsletters (id) ON DELETE CASCADE,
    subscriber_id   TEXT      NOT NULL REFERENCES subscribers (id) ON DELETE CASCADE,
    kind            TEXT      NOT NULL,
    state           TEXT      NOT NULL CHECK (state IN ('pending', 'sent', 'failed', 'cancelled')),
    attempts        INTEGER   NOT NULL,
    next_attempt_at TIMESTAMP NOT NULL,
    last_error      TEXT      NOT NULL,
    traceparent     TEXT      NOT NULL,
    created_at      TIMESTAMP NOT NULL,
    updated_at      TIMESTAMP NOT NULL,
    sent_at         TIMESTAMP
);

--bun:split

CREATE INDEX email_outbox_due_idx ON email_outbox (next_attempt_at) WHERE state = 'pending';

--bun:split

CREATE INDEX email_outbox_subscriber_idx ON email_outbox (subscriber_id) WHERE state = 'pending';

--bun:split

-- Confirmation tokens, stored only as a hash. retired_at marks a token superseded or
-- invalidated; confirmed_at the token that did the confirming.
CREATE TABLE confirmation_tokens (
    hash          BLOB PRIMARY KEY,
    subscriber_id TEXT      NOT NULL REFERENCES subscribers (id) ON DELETE CASCADE,
    outbox_id     TEXT      REFERENCES email_outbox (id) ON DELETE SET NULL,
    created_at    TIMESTAMP NOT NULL,
    expires_at    TIMESTAMP NOT NULL,
    retired_at    TIMESTAMP,
    confirmed_at  TIMESTAMP
);

--bun:split

CREATE INDEX confirmation_tokens_subscriber_idx ON confirmation_tokens (subscriber_id);
