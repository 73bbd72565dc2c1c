-- An import's rows are validated once, at the upload, and staged typed (issue 48): each batch
-- then creates its subscribers, events, deliveries and emails with a few set-based statements
-- instead of reading every row into the service and writing it back.
--
-- A valid row has email (as given), email_key (model.EmailKey), email_hash and legacy_hash
-- (model.EmailHashes: what the suppression list is matched on, legacy_hash NULL when it is
-- email_hash), the names and the status; an invalid one only errors,
-- its field messages as the JSON object GET /imports/{id}/errors returns. duplicate marks a
-- valid row whose address an earlier valid row of the same file has (docs/api-contract.md §15:
-- it counts as existing); it is set once, after the last row is staged. data is the row as
-- uploaded by a version before this one (NULL for rows staged typed): a batch that meets such
-- rows validates them first. Room is left for further typed columns (attributes, tags).
ALTER TABLE import_rows ALTER COLUMN data DROP NOT NULL;

--bun:split

ALTER TABLE import_rows
    ADD COLUMN email      text,
    ADD COLUMN email_key  text,
    ADD COLUMN email_hash bytea,
    ADD COLUMN legacy_hash bytea,
    ADD COLUMN first_name text,
    ADD COLUMN last_name  text,
    ADD COLUMN status     text,
    ADD COLUMN errors     text,
    ADD COLUMN duplicate  boolean NOT NULL DEFAULT false;

--bun:split

-- A UUID version 7 (RFC 9562) of the clock's millisecond, as the service makes its ids
-- (uuid.NewV7), so that the ids an import's batch makes in SQL sort by time like the others.
-- Its 74 random bits come from random() (PostgreSQL's per-session generator, seeded from the
-- system's strong source): ids must be unique, not secret, and gen_random_uuid() cost
-- three times as much, a few milliseconds of every 1,000-row batch that makes 2,000 to 3,000
-- ids. Ids made in the same millisecond are in no particular order among themselves.
CREATE FUNCTION uuid_v7() RETURNS uuid
LANGUAGE sql VOLATILE AS $$
    SELECT encode(
        int8send((floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint << 16) -- unix_ts_ms
                 | 28672                                                             -- version 7
                 | floor(random() * 4096)::bigint)                                   -- rand_a
        || int8send(floor(random() * 4611686018427387904)::bigint                    -- rand_b (62 bits)
                    | (-9223372036854775808)::bigint),                               -- variant 10
        'hex')::uuid
$$;
