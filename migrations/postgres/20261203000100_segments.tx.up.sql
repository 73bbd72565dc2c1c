-- Segments (docs/api-contract.md §20.1): a newsletter's saved, dynamic filters. filter is the
-- segment's filter object in its canonical form (model.Filter.JSON), read only by the service,
-- which evaluates it anew on each use. name_key is the name as names are compared
-- (model.SegmentNameKey: case-folded), unique per newsletter; its "C" collation makes the
-- list's order (by name_key, GET /segments) code point order, as on SQLite, and lets the
-- unique index serve it. A newsletter's segments go with it.
CREATE TABLE segments (
    id            uuid PRIMARY KEY,
    newsletter_id uuid        NOT NULL REFERENCES newsletters (id) ON DELETE CASCADE,
    name          text        NOT NULL,
    name_key      text        COLLATE "C" NOT NULL,
    filter        jsonb       NOT NULL CHECK (jsonb_typeof(filter) = 'object'),
    created_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL
);

--bun:split

CREATE UNIQUE INDEX segments_newsletter_name_key ON segments (newsletter_id, name_key);
