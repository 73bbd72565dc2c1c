-- docs/api-contract.md §18: an address is matched on the suppression list by the hash of its
-- key and, for an erased entry made before 1.3, by the hash of its 1.2 key (model.EmailHashes).
-- This is suppression_after_lock (see 20261128001100) with the second hash; legacy is the
-- first hash again when the two are the same. The three-argument form stays for 1.2
-- instances still serving during a roll-out.
CREATE FUNCTION suppression_after_lock(lock_key text, newsletter uuid, hash bytea, legacy bytea) RETURNS text
LANGUAGE sql VOLATILE AS $$
    SELECT pg_advisory_xact_lock(hashtextextended(lock_key, 0));
    SELECT reason FROM suppressions WHERE newsletter_id = newsletter AND email_hash IN (hash, legacy)
    ORDER BY email_hash = hash DESC LIMIT 1;
$$;
