-- The suppression list, with the semantics of the PostgreSQL set
-- (migrations/postgres/20261128000400_suppressions.tx.up.sql).
CREATE TABLE suppressions (
    id            TEXT PRIMARY KEY,
    newsletter_id TEXT      NOT NULL REFERENCES newsletters (id) ON DELETE CASCADE,
    email         TEXT,
    email_key     TEXT,
    email_hash    BLOB      NOT NULL,
    reason        TEXT      NOT NULL CHECK (reason IN ('manual', 'hard_bounce', 'complaint', 'declined', 'erased')),
    source        TEXT      NOT NULL,
    created_at    TIMESTAMP NOT NULL,
    UNIQUE (newsletter_id, email_hash),
    CHECK ((reason = 'erased') = (email IS NULL) AND (email IS NULL) = (email_key IS NULL))
);

--bun:split

CREATE INDEX suppressions_list_idx ON suppressions (newsletter_id, created_at DESC, id DESC);

--bun:split

CREATE INDEX suppressions_reason_list_idx ON suppressions (newsletter_id, reason, created_at DESC, id DESC);
