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
-- The check is planned at each call (EXECUTE), with the arguments' values and the tables' sizes
-- as they are then: a plan kept for the session (plan_cache_mode is force_generic_plan) made
-- while a table was small probed each address through another index of the newsletter's
-- subscribers, reading all of them, and kept doing so as the table grew, until it was analyzed.
-- Each probe is a scalar subquery: an EXISTS could become a hash of every subscriber of the
-- newsletter. OFFSET 0 keeps the probes from being run again by the outer filter.
CREATE FUNCTION bulk_create_check(newsletter uuid, lock_keys text[], email_keys text[], hashes bytea[], legacy bytea[])
RETURNS TABLE (pos bigint, reason text, taken boolean)
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    PERFORM lock_email_keys(newsletter, lock_keys);
    PERFORM lock_timeout_rest();
    RETURN QUERY EXECUTE $q$
    SELECT c.pos, c.reason, c.taken FROM (
        SELECT a.pos,
            (SELECT x.reason FROM suppressions AS x
             WHERE x.newsletter_id = $1 AND x.email_hash IN (a.hash, a.legacy)
             ORDER BY x.email_hash = a.hash DESC LIMIT 1) AS reason,
            (SELECT true FROM subscribers AS s WHERE s.newsletter_id = $1 AND s.email_key = a.key) IS NOT NULL AS taken
        FROM unnest($2, $3, $4) WITH ORDINALITY AS a (key, hash, legacy, pos)
        OFFSET 0
    ) AS c
    WHERE c.reason IS NOT NULL OR c.taken$q$
    USING newsletter, email_keys, hashes, legacy;
END
$fn$;
