-- Attributes and tags (docs/api-contract.md §19), with the semantics of the PostgreSQL set:
-- attributes a JSON object as text (model.Attributes.JSON: compact, keys sorted, numbers in
-- canonical spelling), tags a JSON array of text, sorted by code point (the BINARY collation
-- of UTF-8 is that order) and without duplicates. Filters read them with JSON1 functions
-- (json_each, ->>); there is no index of their contents, as SQLite has none for a JSON array.
ALTER TABLE subscribers ADD COLUMN attributes TEXT NOT NULL DEFAULT '{}';

--bun:split

ALTER TABLE subscribers ADD COLUMN tags TEXT NOT NULL DEFAULT '[]';

--bun:split

-- Exact subscriber counts per newsletter and tag (GET /tags), any status, kept in the same
-- transaction as every change by the row triggers below. SQLite serialises writers, so one row
-- per newsletter and tag is enough; a tag whose count is 0 is held by nobody.
CREATE TABLE subscriber_tag_counts (
    newsletter_id TEXT    NOT NULL REFERENCES newsletters (id) ON DELETE CASCADE,
    tag           TEXT    NOT NULL,
    n             INTEGER NOT NULL,
    PRIMARY KEY (newsletter_id, tag)
) WITHOUT ROWID;

--bun:split

CREATE TRIGGER subscribers_tag_count_insert AFTER INSERT ON subscribers
WHEN NEW.tags <> '[]'
BEGIN
    INSERT INTO subscriber_tag_counts (newsletter_id, tag, n)
    SELECT NEW.newsletter_id, value, 1 FROM json_each(NEW.tags) WHERE true
    ON CONFLICT (newsletter_id, tag) DO UPDATE SET n = n + 1;
END;

--bun:split

CREATE TRIGGER subscribers_tag_count_update AFTER UPDATE OF tags ON subscribers
WHEN OLD.tags IS NOT NEW.tags
BEGIN
    UPDATE subscriber_tag_counts SET n = n - 1
    WHERE newsletter_id = OLD.newsletter_id AND tag IN (SELECT value FROM json_each(OLD.tags));
    INSERT INTO subscriber_tag_counts (newsletter_id, tag, n)
    SELECT NEW.newsletter_id, value, 1 FROM json_each(NEW.tags) WHERE true
    ON CONFLICT (newsletter_id, tag) DO UPDATE SET n = n + 1;
END;

--bun:split

CREATE TRIGGER subscribers_tag_count_delete AFTER DELETE ON subscribers
WHEN OLD.tags <> '[]'
BEGIN
    UPDATE subscriber_tag_counts SET n = n - 1
    WHERE newsletter_id = OLD.newsletter_id AND tag IN (SELECT value FROM json_each(OLD.tags));
END;
