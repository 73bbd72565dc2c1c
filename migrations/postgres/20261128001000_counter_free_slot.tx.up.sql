-- Counter slots are chosen free, not by backend pid (issue 43). Each connection wrote the
-- slot pg_backend_pid() % 16; two connections whose pids share a slot queued on its counter row,
-- each behind the other's whole transaction, commit flush included, and which connections
-- collided was a matter of luck for the pool's lifetime. Now a statement takes the first slot,
-- from its connection's own, whose transaction-scoped advisory lock (the table's oid and the
-- slot) is free: only the holder of a slot's lock writes that slot's rows, so writers never
-- wait on a counter row while a slot is free, and wait for their own slot's lock only when all
-- 16 are held. A transaction that holds a slot finds it again (the lock is re-entrant), so it
-- never waits either. Totals stay the sum of the rows, exact, in the same transaction.

CREATE OR REPLACE FUNCTION subscriber_counts_apply() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    own   CONSTANT integer := pg_backend_pid() % 16;
    class CONSTANT integer := 'subscriber_counts'::regclass::oid::integer;
    chosen integer;
BEGIN
    -- The counter slot: the first one, from the connection's own, that no other transaction
    -- holds (a transaction holds its slot's advisory lock until it ends, as it holds the
    -- slot's rows), so concurrent writers do not queue on one row behind each other's
    -- commits. Only when every slot is held does the statement wait for its own.
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
    -- Rows are upserted in (newsletter_id, status) order so two statements never lock the
    -- same counter rows in opposite orders.
    IF TG_OP = 'INSERT' THEN
        INSERT INTO subscriber_counts AS c (newsletter_id, status, slot, n)
        SELECT newsletter_id, status, chosen, count(*)
        FROM new_rows GROUP BY newsletter_id, status ORDER BY newsletter_id, status
        ON CONFLICT (newsletter_id, status, slot) DO UPDATE SET n = c.n + EXCLUDED.n;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO subscriber_counts AS c (newsletter_id, status, slot, n)
        SELECT newsletter_id, status, chosen, sum(d)
        FROM (SELECT newsletter_id, status, 1 AS d FROM new_rows
              UNION ALL
              SELECT newsletter_id, status, -1 AS d FROM old_rows) AS delta
        GROUP BY newsletter_id, status HAVING sum(d) <> 0 ORDER BY newsletter_id, status
        ON CONFLICT (newsletter_id, status, slot) DO UPDATE SET n = c.n + EXCLUDED.n;
    ELSE
        INSERT INTO subscriber_counts AS c (newsletter_id, status, slot, n)
        SELECT newsletter_id, status, chosen, -count(*)
        FROM old_rows GROUP BY newsletter_id, status ORDER BY newsletter_id, status
        ON CONFLICT (newsletter_id, status, slot) DO UPDATE SET n = c.n + EXCLUDED.n;
    END IF;
    RETURN NULL;
END
$$;
