-- Segments (docs/api-contract.md §20.1), with the semantics of the PostgreSQL set
-- (migrations/postgres/20261203000100_segments.tx.up.sql): filter the canonical filter object
-- as JSON text, name_key the case-folded name, unique per newsletter; the BINARY collation of
-- UTF-8 orders name_key by code point, as "C" does on PostgreSQL.
CREATE TABLE segments (
    id            TEXT PRIMARY KEY,
    newsletter_id TEXT      NOT NULL REFERENCES newsletters (id) ON DELETE CASCADE,
    name          TEXT      NOT NULL,
    name_key      TEXT      NOT NULL,
    filter        TEXT      NOT NULL CHECK (json_valid(filter) AND json_type(filter) = 'object'),
    created_at    TIMESTAMP NOT NULL,
    updated_at    TIMESTAMP NOT NULL
);

--bun:split

CREATE UNIQUE INDEX segments_newsletter_name_key ON segments (newsletter_id, name_key);
