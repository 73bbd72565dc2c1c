-- Imports, with the semantics of the PostgreSQL set
-- (migrations/postgres/20261128000700_imports.tx.up.sql).
CREATE TABLE imports (
    id             TEXT PRIMARY KEY,
    newsletter_id  TEXT      NOT NULL REFERENCES newsletters (id) ON DELETE CASCADE,
    state          TEXT      NOT NULL CHECK (state IN ('uploading', 'queued', 'running', 'completed', 'cancelled')),
    format         TEXT      NOT NULL CHECK (format IN ('csv', 'ndjson')),
    default_status TEXT      NOT NULL CHECK (default_status IN ('active', 'pending')),
    key_prefix     TEXT      NOT NULL,
    traceparent    TEXT      NOT NULL,
    row_count      INTEGER   NOT NULL,
    processed      INTEGER   NOT NULL,
    created        INTEGER   NOT NULL,
    existing       INTEGER   NOT NULL,
    suppressed     INTEGER   NOT NULL,
    invalid        INTEGER   NOT NULL,
    claim          TEXT,
    lease_until    TIMESTAMP,
    created_at     TIMESTAMP NOT NULL,
    updated_at     TIMESTAMP NOT NULL,
    started_at     TIMESTAMP,
    finished_at    TIMESTAMP
);

--bun:split

CREATE INDEX imports_list_idx ON imports (newsletter_id, created_at DESC, id DESC);

--bun:split

CREATE INDEX imports_due_idx ON imports (created_at, id) WHERE state IN ('queued', 'running');

--bun:split

CREATE UNIQUE INDEX imports_one_running_idx ON imports (newsletter_id) WHERE state = 'running';

--bun:split

CREATE TABLE import_rows (
    import_id TEXT    NOT NULL,
    row_no    INTEGER NOT NULL,
    data      TEXT    NOT NULL,
    PRIMARY KEY (import_id, row_no)
) WITHOUT ROWID;

--bun:split

CREATE TABLE import_errors (
    import_id TEXT    NOT NULL REFERENCES imports (id) ON DELETE CASCADE,
    row_no    INTEGER NOT NULL,
    errors    TEXT    NOT NULL,
    PRIMARY KEY (import_id, row_no)
) WITHOUT ROWID;
