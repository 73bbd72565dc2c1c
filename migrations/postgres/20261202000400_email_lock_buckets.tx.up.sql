-- The advisory locks that order a subscribe and a suppression of the same address
-- (docs/api-contract.md §13) are taken per bucket of addresses, not per address: an import
-- batch of 1,000 rows took 1,000 advisory locks in one transaction, and PostgreSQL's shared
-- lock table holds about 6,400 (max_locks_per_transaction × max_connections), so a few
-- concurrent batches failed with 53200 (out of shared memory). A transaction now takes at most
-- 64 of them, whatever it writes.
--
-- lock_email_keys takes, until the transaction ends, the locks of lock_keys (each
-- "<newsletter id>/<normalised address>") of the newsletter: the two-key advisory lock
-- (hashtext of the newsletter id, hashtext of the key modulo 64), each bucket once, in
-- ascending order, so that two transactions locking several buckets wait rather than
-- deadlock. Two addresses in one bucket only make their writes wait for each other. The
-- two-key locks are a space of their own: the one-key locks of Idempotency-Key never meet
-- them. It returns how many buckets it locked.
CREATE FUNCTION lock_email_keys(newsletter uuid, lock_keys text[]) RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT count(pg_advisory_xact_lock(b.nl, b.bucket)) FROM (
        SELECT DISTINCT hashtext(newsletter::text) AS nl, hashtext(k) & 63 AS bucket
        FROM unnest(lock_keys) AS k
        ORDER BY 1, 2
    ) AS b;
$$;

-- The one-statement create (migrations suppression_after_lock and
-- suppression_after_lock_legacy) takes the same lock. Its statement may then wait for a second
-- lock, the row of another transaction inserting the same address; lock_timeout bounds each
-- wait, so a create queued behind another that waited for that row answered after twice the
-- lock timeout. Once the address's lock is held, the rest of the statement (and of its
-- transaction) may wait only what is left of lock_timeout since the statement began (at least
-- a millisecond): a create gives up within the lock timeout, as a write that waits for one
-- record does (docs/api-contract.md §4.7). lock_timeout_rest is that step.
CREATE FUNCTION lock_timeout_rest() RETURNS void
LANGUAGE sql VOLATILE AS $$
    SELECT set_config('lock_timeout', greatest(1, floor(extract(epoch FROM
            current_setting('lock_timeout')::interval - (clock_timestamp() - statement_timestamp())) * 1000))::bigint || 'ms', true)
    WHERE current_setting('lock_timeout')::interval > interval '0';
$$;

CREATE OR REPLACE FUNCTION suppression_after_lock(lock_key text, newsletter uuid, hash bytea, legacy bytea) RETURNS text
LANGUAGE sql VOLATILE AS $$
    SELECT lock_email_keys(newsletter, ARRAY[lock_key]);
    SELECT lock_timeout_rest();
    SELECT reason FROM suppressions WHERE newsletter_id = newsletter AND email_hash IN (hash, legacy)
    ORDER BY email_hash = hash DESC LIMIT 1;
$$;

-- The three-argument form, for 1.2 instances still serving during a roll-out.
CREATE OR REPLACE FUNCTION suppression_after_lock(lock_key text, newsletter uuid, hash bytea) RETURNS text
LANGUAGE sql VOLATILE AS $$
    SELECT lock_email_keys(newsletter, ARRAY[lock_key]);
    SELECT lock_timeout_rest();
    SELECT reason FROM suppressions WHERE newsletter_id = newsletter AND email_hash = hash;
$$;
