-- The address's lock and the suppression check of every create (suppression_after_lock) and
-- the bucket locks of every bulk write (lock_email_keys, lock_timeout_rest) were SQL
-- functions of several statements, or calling one another. PostgreSQL never inlines such a
-- function: it parses and plans each of its statements again on every call. A create paid for
-- five plans before it inserted anything: pgbench with one client, one call a transaction,
-- 0.58-0.69 ms for the SQL form against 0.19-0.25 ms for this one, and 0.06-0.10 ms for a bare
-- SELECT 1. PL/pgSQL keeps each statement's plan for the life of the connection. The bodies do
-- exactly what they did (migration 20261202000400): same locks, in the same order, the same
-- rest of lock_timeout, the same suppression looked up; only the language changes.

CREATE OR REPLACE FUNCTION lock_email_keys(newsletter uuid, lock_keys text[]) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    n bigint;
BEGIN
    SELECT count(pg_advisory_xact_lock(b.nl, b.bucket)) INTO n FROM (
        SELECT DISTINCT hashtext(newsletter::text) AS nl, hashtext(k) & 63 AS bucket
        FROM unnest(lock_keys) AS k
        ORDER BY 1, 2
    ) AS b;
    RETURN n;
END
$$;

CREATE OR REPLACE FUNCTION lock_timeout_rest() RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF current_setting('lock_timeout')::interval > interval '0' THEN
        PERFORM set_config('lock_timeout', greatest(1, floor(extract(epoch FROM
            current_setting('lock_timeout')::interval - (clock_timestamp() - statement_timestamp())) * 1000))::bigint || 'ms', true);
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION suppression_after_lock(lock_key text, newsletter uuid, hash bytea, legacy bytea) RETURNS text
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    found_reason text;
BEGIN
    PERFORM lock_email_keys(newsletter, ARRAY[lock_key]);
    PERFORM lock_timeout_rest();
    SELECT s.reason INTO found_reason FROM suppressions AS s
    WHERE s.newsletter_id = newsletter AND s.email_hash IN (hash, legacy)
    ORDER BY s.email_hash = hash DESC LIMIT 1;
    RETURN found_reason;
END
$$;

-- The three-argument form, for 1.2 instances still serving during a roll-out: the
-- four-argument form with the one hash in both places looks up the same entry.
CREATE OR REPLACE FUNCTION suppression_after_lock(lock_key text, newsletter uuid, hash bytea) RETURNS text
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN suppression_after_lock(lock_key, newsletter, hash, hash);
END
$$;
