-- The one-statement bulk create (repo/pg.go, createManyStmt): what suppression_after_lock is to
-- the one-statement create, for up to 100 addresses at once. It takes the locks of lock_keys
-- (lock_email_keys: each bucket once, in ascending order, so that two bulks sharing addresses
-- wait rather than deadlock), bounds the rest of the statement's waits as the create does
-- (lock_timeout_rest), and then, each statement of a VOLATILE function reading a snapshot of its
-- own, sees what was committed while it waited: for each address (email_keys, hashes and legacy
-- at the same position, numbered from 1), the reason the newsletter's suppression list holds it
-- for, the entry under its own key's hash first (docs/api-contract.md §13, §18; legacy is hashes'
-- element again when the two are the same), and whether the newsletter has a subscriber with its
-- key. It returns only the addresses with one or the other, none when the bulk may go in.
--
-- PL/pgSQL, unlike an SQL function, keeps its statements' plans for the session: the check is
-- planned once per connection, not at each bulk.
CREATE FUNCTION bulk_create_check(newsletter uuid, lock_keys text[], email_keys text[], hashes bytea[], legacy bytea[])
RETURNS TABLE (pos bigint, reason text, taken boolean)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM lock_email_keys(newsletter, lock_keys);
    PERFORM lock_timeout_rest();
    RETURN QUERY
    SELECT c.pos, c.reason, c.taken FROM (
        SELECT a.pos,
            (SELECT x.reason FROM suppressions AS x
             WHERE x.newsletter_id = newsletter AND x.email_hash IN (a.hash, a.legacy)
             ORDER BY x.email_hash = a.hash DESC LIMIT 1) AS reason,
            EXISTS (SELECT 1 FROM subscribers AS s WHERE s.newsletter_id = newsletter AND s.email_key = a.key) AS taken
        FROM unnest(email_keys, hashes, legacy) WITH ORDINALITY AS a (key, hash, legacy, pos)
    ) AS c
    WHERE c.reason IS NOT NULL OR c.taken;
END
$$;
