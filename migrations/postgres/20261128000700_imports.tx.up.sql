-- Imports (docs/api-contract.md §15): the import itself, its rows staged as uploaded, and
-- the errors of the rows that were invalid.
--
-- state 'uploading' is an upload still arriving on the SQLite store (PostgreSQL stages in one
-- transaction and never shows it); nothing but the upload sees such an import.
-- processed is the number of rows handled by committed batches: a resumed import goes on
-- after it. claim is the token of the worker that holds the import until lease_until.
CREATE TABLE imports (
    id             uuid PRIMARY KEY,
    newsletter_id  uuid        NOT NULL REFERENCES newsletters (id) ON DELETE CASCADE,
    state          text        NOT NULL CHECK (state IN ('uploading', 'queued', 'running', 'completed', 'cancelled')),
    format         text        NOT NULL CHECK (format IN ('csv', 'ndjson')),
    default_status text        NOT NULL CHECK (default_status IN ('active', 'pending')),
    key_prefix     text        NOT NULL,
    traceparent    text        NOT NULL,
    row_count      bigint      NOT NULL,
    processed      bigint      NOT NULL,
    created        bigint      NOT NULL,
    existing       bigint      NOT NULL,
    suppressed     bigint      NOT NULL,
    invalid        bigint      NOT NULL,
    claim          uuid,
    lease_until    timestamptz,
    created_at     timestamptz NOT NULL,
    updated_at     timestamptz NOT NULL,
    started_at     timestamptz,
    finished_at    timestamptz
);

--bun:split

-- Newest first per newsletter (GET /imports).
CREATE INDEX imports_list_idx ON imports (newsletter_id, created_at DESC, id DESC);

--bun:split

-- The work queue, oldest first.
CREATE INDEX imports_due_idx ON imports (created_at, id) WHERE state IN ('queued', 'running');

--bun:split

-- One running import per newsletter: a second claim fails on this index.
CREATE UNIQUE INDEX imports_one_running_idx ON imports (newsletter_id) WHERE state = 'running';

--bun:split

-- The rows as uploaded: data is the row as a JSON object (a CSV row's columns by name, an
-- NDJSON line as given). No foreign key: the rows are written by COPY and removed when the
-- import finishes.
CREATE TABLE import_rows (
    import_id uuid   NOT NULL,
    row_no    bigint NOT NULL,
    data      text   NOT NULL,
    PRIMARY KEY (import_id, row_no)
);

--bun:split

CREATE TABLE import_errors (
    import_id uuid   NOT NULL REFERENCES imports (id) ON DELETE CASCADE,
    row_no    bigint NOT NULL,
    errors    text   NOT NULL,
    PRIMARY KEY (import_id, row_no)
);
