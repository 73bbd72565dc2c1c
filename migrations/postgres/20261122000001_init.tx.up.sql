-- The whole schema of subscriberd on PostgreSQL. Timestamps and ids are set by the service.

CREATE TABLE newsletters (
    id         uuid PRIMARY KEY,
    name       text        NOT NULL,
    api_access boolean     NOT NULL,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL
);

--bun:split

CREATE TABLE api_keys (
    id            uuid PRIMARY KEY,
    newsletter_id uuid        NOT NULL REFERENCES newsletters (id) ON DELETE CASCADE,
    prefix        text        NOT NULL,
    hash          bytea       NOT NULL CONSTRAINT api_keys_hash_key UNIQUE,
    label         text        NOT NULL,
    created_at    timestamptz NOT NULL,
    revoked_at    timestamptz
);

--bun:split

CREATE INDEX api_keys_newsletter_id_idx ON api_keys (newsletter_id);

--bun:split

-- email is stored as given (trimmed); email_key is its case-folded form, computed by the
-- service, and is what uniqueness is judged on.
CREATE TABLE subscribers (
    id            uuid PRIMARY KEY,
    newsletter_id uuid        NOT NULL REFERENCES newsletters (id) ON DELETE CASCADE,
    email         text        NOT NULL,
    email_key     text        NOT NULL,
    first_name    text        NOT NULL,
    last_name     text        NOT NULL,
    status        text        NOT NULL CHECK (status IN ('active', 'pending', 'unsubscribed')),
    created_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL,
    CONSTRAINT subscribers_newsletter_email_key UNIQUE (newsletter_id, email_key)
);

--bun:split

-- The list order (newest first, id breaking ties), unfiltered and filtered by status. Both
-- carry id so a page's ids come from the index alone.
CREATE INDEX subscribers_list_idx ON subscribers (newsletter_id, created_at DESC, id DESC);

--bun:split

CREATE INDEX subscribers_status_list_idx ON subscribers (newsletter_id, status, created_at DESC, id DESC);

--bun:split

-- Exact subscriber totals per newsletter and status, kept in the same transaction as every
-- change by the triggers below. Each connection writes its own slot (backend pid modulo 16), so
-- concurrent writers of one newsletter do not queue on one row; a total is the sum of at most
-- 48 small rows, whatever the table size.
CREATE TABLE subscriber_counts (
    newsletter_id uuid     NOT NULL REFERENCES newsletters (id) ON DELETE CASCADE,
    status        text     NOT NULL,
    slot          smallint NOT NULL,
    n             bigint   NOT NULL,
    PRIMARY KEY (newsletter_id, status, slot)
);

--bun:split

CREATE FUNCTION subscriber_counts_apply() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- Rows are upserted in (newsletter_id, status) order so two statements never lock the
    -- same counter rows in opposite orders.
    IF TG_OP = 'INSERT' THEN
        INSERT INTO subscriber_counts AS c (newsletter_id, status, slot, n)
        SELECT newsletter_id, status, pg_backend_pid() % 16, count(*)
        FROM new_rows GROUP BY newsletter_id, status ORDER BY newsletter_id, status
        ON CONFLICT (newsletter_id, status, slot) DO UPDATE SET n = c.n + EXCLUDED.n;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO subscriber_counts AS c (newsletter_id, status, slot, n)
        SELECT newsletter_id, status, pg_backend_pid() % 16, sum(d)
        FROM (SELECT newsletter_id, status, 1 AS d FROM new_rows
              UNION ALL
              SELECT newsletter_id, status, -1 AS d FROM old_rows) AS delta
        GROUP BY newsletter_id, status HAVING sum(d) <> 0 ORDER BY newsletter_id, status
        ON CONFLICT (newsletter_id, status, slot) DO UPDATE SET n = c.n + EXCLUDED.n;
    ELSE
        INSERT INTO subscriber_counts AS c (newsletter_id, status, slot, n)
        SELECT newsletter_id, status, pg_backend_pid() % 16, -count(*)
        FROM old_rows GROUP BY newsletter_id, status ORDER BY newsletter_id, status
        ON CONFLICT (newsletter_id, status, slot) DO UPDATE SET n = c.n + EXCLUDED.n;
    END IF;
    RETURN NULL;
END
$$;

--bun:split

CREATE TRIGGER subscribers_count_insert AFTER INSERT ON subscribers
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION subscriber_counts_apply();

--bun:split

CREATE TRIGGER subscribers_count_update AFTER UPDATE ON subscribers
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION subscriber_counts_apply();

--bun:split

CREATE TRIGGER subscribers_count_delete AFTER DELETE ON subscribers
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION subscriber_counts_apply();

--bun:split

-- The transactional outbox of confirmation emails. A row holds no secret: the worker makes the
-- token when it sends. traceparent links the send to the request that queued it.
CREATE TABLE email_outbox (
    id              uuid PRIMARY KEY,
    newsletter_id   uuid        NOT NULL REFERENCES newsletters (id) ON DELETE CASCADE,
    subscriber_id   uuid        NOT NULL REFERENCES subscribers (id) ON DELETE CASCADE,
    kind            text        NOT NULL,
    state           text        NOT NULL CHECK (state IN ('pending', 'sent', 'failed', 'cancelled')),
    attempts        integer     NOT NULL,
    next_attempt_at timestamptz NOT NULL,
    last_error      text        NOT NULL,
    traceparent     text        NOT NULL,
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    sent_at         timestamptz
);

--bun:split

CREATE INDEX email_outbox_due_idx ON email_outbox (next_attempt_at) WHERE state = 'pending';

--bun:split

CREATE INDEX email_outbox_subscriber_idx ON email_outbox (subscriber_id) WHERE state = 'pending';

--bun:split

-- Confirmation tokens, stored only as a hash. retired_at marks a token superseded or
-- invalidated; confirmed_at the token that did the confirming.
CREATE TABLE confirmation_tokens (
    hash          bytea PRIMARY KEY,
    subscriber_id uuid        NOT NULL REFERENCES subscribers (id) ON DELETE CASCADE,
    outbox_id     uuid        REFERENCES email_outbox (id) ON DELETE SET NULL,
    created_at    timestamptz NOT NULL,
    expires_at    timestamptz NOT NULL,
    retired_at    timestamptz,
    confirmed_at  timestamptz
);

--bun:split

CREATE INDEX confirmation_tokens_subscriber_idx ON confirmation_tokens (subscriber_id);
