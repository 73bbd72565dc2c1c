-- Attributes and tags (docs/api-contract.md §19). attributes is a flat JSON object of string,
-- number and boolean values, tags a set of labels; model validates both (model.ParseAttributes,
-- model.ParseTags) and repo writes tags sorted by code point and without duplicates, which
-- COLLATE "C" keeps when SQL itself sorts them (the tags operation, bulk actions). Numbers are
-- stored in model's canonical spelling (no exponent, no trailing zeros, no -0), so that
-- jsonb's numeric equality and the contract's "JSON text equals the value" agree.
-- Both columns have constant defaults: adding them rewrites nothing.
ALTER TABLE subscribers
    ADD COLUMN attributes jsonb NOT NULL DEFAULT '{}',
    ADD COLUMN tags text[] COLLATE "C" NOT NULL DEFAULT '{}';

--bun:split

-- attr[key]=value is containment, attributes @> '{"key": value}' (a string, or a number or
-- boolean as well when the value is spelled as one); jsonb_path_ops indexes each key-and-value
-- path as one hash, so such a lookup reads one posting list. It cannot answer key existence
-- (has_attr), which the next index does.
CREATE INDEX subscribers_attributes_idx ON subscribers USING gin (attributes jsonb_path_ops)
    WHERE attributes <> '{}';

--bun:split

-- has_attr=key: the keys alone, an expression index on model's subscriber_attribute_keys.
CREATE FUNCTION subscriber_attribute_keys(attributes jsonb) RETURNS text[]
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT coalesce(array_agg(k), '{}') FROM jsonb_object_keys(attributes) AS k
$$;

--bun:split

CREATE INDEX subscribers_attribute_keys_idx ON subscribers USING gin (subscriber_attribute_keys(attributes))
    WHERE attributes <> '{}';

--bun:split

-- tag=t is tags @> ARRAY[t]. Both indexes leave out the subscribers with nothing in the
-- column (the queries say attributes <> '{}' or tags <> '{}' too), so creates and imports
-- without attributes or tags pay nothing for them.
CREATE INDEX subscribers_tags_idx ON subscribers USING gin (tags) WHERE tags <> '{}';

--bun:split

-- Exact subscriber counts per newsletter and tag (GET /tags), any status, kept in the same
-- transaction as every change by the triggers below, spread over 16 slots as subscriber_counts
-- is (migration 20261128001000): a statement takes the first slot, from its connection's own,
-- whose advisory lock (this table's oid and the slot) is free, so concurrent writers of the
-- same tag do not queue on one row. A count is the sum of its rows; a tag whose sum is 0 is
-- held by nobody. tag is "C" collated so that the key's order is the contract's (code point).
CREATE TABLE subscriber_tag_counts (
    newsletter_id uuid             NOT NULL REFERENCES newsletters (id) ON DELETE CASCADE,
    tag           text COLLATE "C" NOT NULL,
    slot          smallint         NOT NULL,
    n             bigint           NOT NULL,
    PRIMARY KEY (newsletter_id, tag, slot)
);

--bun:split

CREATE FUNCTION subscriber_tag_counts_apply() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    own   CONSTANT integer := pg_backend_pid() % 16;
    class CONSTANT integer := 'subscriber_tag_counts'::regclass::oid::integer;
    chosen integer;
BEGIN
    -- Most writes touch no tag (an import without a tags column, a rename of an untagged
    -- subscriber): they leave without a lock or a scan of the unnested sets. The checks and
    -- the deltas below never join old_rows to new_rows: transition tables have no statistics
    -- and no index, and a join of them was planned as a nested loop, quadratic in the rows a
    -- statement changed (80 s for a rename of 11,111 tagged subscribers).
    IF TG_OP <> 'DELETE' THEN
        PERFORM 1 FROM new_rows WHERE tags <> '{}' LIMIT 1;
    END IF;
    IF TG_OP = 'DELETE' OR TG_OP = 'UPDATE' AND NOT FOUND THEN
        PERFORM 1 FROM old_rows WHERE tags <> '{}' LIMIT 1;
    END IF;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    FOR i IN 0..15 LOOP
        IF pg_try_advisory_xact_lock(class, (own + i) % 16) THEN
            chosen := (own + i) % 16;
            EXIT;
        END IF;
    END LOOP;
    IF chosen IS NULL THEN
        chosen := own;
        PERFORM pg_advisory_xact_lock(class, chosen);
    END IF;
    -- Rows are upserted in (newsletter_id, tag) order so two statements never lock the same
    -- counter rows in opposite orders.
    IF TG_OP = 'INSERT' THEN
        INSERT INTO subscriber_tag_counts AS c (newsletter_id, tag, slot, n)
        SELECT r.newsletter_id, t.tag, chosen, count(*)
        FROM new_rows AS r, unnest(r.tags) AS t (tag)
        GROUP BY r.newsletter_id, t.tag ORDER BY r.newsletter_id, t.tag
        ON CONFLICT (newsletter_id, tag, slot) DO UPDATE SET n = c.n + EXCLUDED.n;
    ELSIF TG_OP = 'UPDATE' THEN
        -- Every tag of the rows after, counted up, and before, counted down: what a statement
        -- left as it was cancels out and writes nothing.
        INSERT INTO subscriber_tag_counts AS c (newsletter_id, tag, slot, n)
        SELECT newsletter_id, tag, chosen, sum(d)
        FROM (SELECT r.newsletter_id, t.tag, 1 AS d FROM new_rows AS r, unnest(r.tags) AS t (tag)
              UNION ALL
              SELECT r.newsletter_id, t.tag, -1 AS d FROM old_rows AS r, unnest(r.tags) AS t (tag)) AS delta
        GROUP BY newsletter_id, tag HAVING sum(d) <> 0 ORDER BY newsletter_id, tag
        ON CONFLICT (newsletter_id, tag, slot) DO UPDATE SET n = c.n + EXCLUDED.n;
    ELSE
        INSERT INTO subscriber_tag_counts AS c (newsletter_id, tag, slot, n)
        SELECT r.newsletter_id, t.tag, chosen, -count(*)
        FROM old_rows AS r, unnest(r.tags) AS t (tag)
        GROUP BY r.newsletter_id, t.tag ORDER BY r.newsletter_id, t.tag
        ON CONFLICT (newsletter_id, tag, slot) DO UPDATE SET n = c.n + EXCLUDED.n;
    END IF;
    RETURN NULL;
END
$$;

--bun:split

CREATE TRIGGER subscribers_tag_count_insert AFTER INSERT ON subscribers
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION subscriber_tag_counts_apply();

--bun:split

CREATE TRIGGER subscribers_tag_count_update AFTER UPDATE ON subscribers
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION subscriber_tag_counts_apply();

--bun:split

CREATE TRIGGER subscribers_tag_count_delete AFTER DELETE ON subscribers
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION subscriber_tag_counts_apply();
