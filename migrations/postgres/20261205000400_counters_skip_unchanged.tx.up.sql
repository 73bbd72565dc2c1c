-- Most updates of a subscriber change neither its status nor its tags (a new name, email or
-- attributes), yet the counter trigger took a slot's lock and ran both counters' upserts for
-- them, to find that everything cancelled out: on a one-row rename, EXPLAIN ANALYZE put the
-- trigger at 0.077 ms of a 0.15 ms statement. It now returns first when the statement's new
-- rows, as (newsletter, status, tags), are the same multiset as its old rows (EXCEPT ALL of
-- the two is empty; an UPDATE has as many new rows as old), and the trigger costs 0.03 ms.
-- EXCEPT ALL is a hashed or sorted set operation, linear in the rows, never the join of the
-- two transition tables that the comment of migration 20261204000100 warns against. The rest
-- of the function is that migration's, unchanged.

CREATE OR REPLACE FUNCTION subscriber_counts_apply() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    own   CONSTANT integer := pg_backend_pid() % 16;
    class CONSTANT integer := 'subscriber_counts'::regclass::oid::integer;
    chosen integer;
BEGIN
    -- An update that leaves every row's status and tags as they were changes no count. (Two
    -- IFs: an INSERT's or DELETE's trigger has no old_rows or no new_rows to plan the test on.)
    IF TG_OP = 'UPDATE' THEN
        IF NOT EXISTS (
            SELECT newsletter_id, status, tags FROM new_rows
            EXCEPT ALL
            SELECT newsletter_id, status, tags FROM old_rows) THEN
            RETURN NULL;
        END IF;
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
    IF TG_OP = 'INSERT' THEN
        INSERT INTO subscriber_counts AS c (newsletter_id, status, slot, n)
        SELECT newsletter_id, status, chosen, count(*)
        FROM new_rows GROUP BY newsletter_id, status ORDER BY newsletter_id, status
        ON CONFLICT (newsletter_id, status, slot) DO UPDATE SET n = c.n + EXCLUDED.n;
        INSERT INTO subscriber_tag_counts AS c (newsletter_id, tag, slot, n)
        SELECT r.newsletter_id, t.tag, chosen, count(*)
        FROM new_rows AS r, unnest(r.tags) AS t (tag)
        GROUP BY r.newsletter_id, t.tag ORDER BY r.newsletter_id, t.tag
        ON CONFLICT (newsletter_id, tag, slot) DO UPDATE SET n = c.n + EXCLUDED.n;
    ELSIF TG_OP = 'UPDATE' THEN
        -- What a statement left as it was cancels out and writes nothing.
        INSERT INTO subscriber_counts AS c (newsletter_id, status, slot, n)
        SELECT newsletter_id, status, chosen, sum(d)
        FROM (SELECT newsletter_id, status, 1 AS d FROM new_rows
              UNION ALL
              SELECT newsletter_id, status, -1 AS d FROM old_rows) AS delta
        GROUP BY newsletter_id, status HAVING sum(d) <> 0 ORDER BY newsletter_id, status
        ON CONFLICT (newsletter_id, status, slot) DO UPDATE SET n = c.n + EXCLUDED.n;
        INSERT INTO subscriber_tag_counts AS c (newsletter_id, tag, slot, n)
        SELECT newsletter_id, tag, chosen, sum(d)
        FROM (SELECT r.newsletter_id, t.tag, 1 AS d FROM new_rows AS r, unnest(r.tags) AS t (tag)
              UNION ALL
              SELECT r.newsletter_id, t.tag, -1 AS d FROM old_rows AS r, unnest(r.tags) AS t (tag)) AS delta
        GROUP BY newsletter_id, tag HAVING sum(d) <> 0 ORDER BY newsletter_id, tag
        ON CONFLICT (newsletter_id, tag, slot) DO UPDATE SET n = c.n + EXCLUDED.n;
    ELSE
        INSERT INTO subscriber_counts AS c (newsletter_id, status, slot, n)
        SELECT newsletter_id, status, chosen, -count(*)
        FROM old_rows GROUP BY newsletter_id, status ORDER BY newsletter_id, status
        ON CONFLICT (newsletter_id, status, slot) DO UPDATE SET n = c.n + EXCLUDED.n;
        INSERT INTO subscriber_tag_counts AS c (newsletter_id, tag, slot, n)
        SELECT r.newsletter_id, t.tag, chosen, -count(*)
        FROM old_rows AS r, unnest(r.tags) AS t (tag)
        GROUP BY r.newsletter_id, t.tag ORDER BY r.newsletter_id, t.tag
        ON CONFLICT (newsletter_id, tag, slot) DO UPDATE SET n = c.n + EXCLUDED.n;
    END IF;
    RETURN NULL;
END
$$;
