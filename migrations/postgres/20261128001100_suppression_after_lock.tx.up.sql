-- A create of one subscriber is one statement again (issue 43). The suppression check of
-- docs/api-contract.md §13 must read the suppression list after taking the address's lock
-- (lockEmailKey's advisory lock), so that a suppression committed while the create waited is
-- seen. A statement reads in the snapshot it started with, before any lock it waits for inside
-- it; so the check was a statement of its own, after the lock's, in a transaction of four
-- round trips more than the insert. A VOLATILE function's queries take a fresh snapshot each:
-- called from the create's statement, this one waits for the lock, then reads the list as it
-- is once the lock is held, and the statement inserts only when it returns NULL. The lock is
-- the transaction's (the statement's own, in autocommit) and holds until it commits.
--
-- lock_key is the advisory lock's key text, "<newsletter id>/<normalised address>"; hash the
-- address's email_hash. It returns the reason the address is suppressed for, or NULL.
CREATE FUNCTION suppression_after_lock(lock_key text, newsletter uuid, hash bytea) RETURNS text
LANGUAGE sql VOLATILE AS $$
    SELECT pg_advisory_xact_lock(hashtextextended(lock_key, 0));
    SELECT reason FROM suppressions WHERE newsletter_id = newsletter AND email_hash = hash;
$$;
