-- An import's rows are validated once, at the upload, and staged typed (issue 48): each batch
-- then creates its subscribers, events, deliveries and emails with a few set-based statements
-- instead of reading every row into the service and writing it back.
--
-- A valid row has email (as given), email_key (model.EmailKey), email_hash (model.EmailHash, what
-- the suppression list is matched on), the names and the status; an invalid one only errors,
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
    ADD COLUMN first_name text,
    ADD COLUMN last_name  text,
    ADD COLUMN status     text,
    ADD COLUMN errors     text,
    ADD COLUMN duplicate  boolean NOT NULL DEFAULT false;

--bun:split

-- A UUID version 7 (RFC 9562) from the clock's milliseconds and random bits, as the service
-- makes its ids (uuid.NewV7): the ids an import's batch makes in SQL sort by time like the
-- others. Ids made in the same millisecond are in no particular order among themselves.
CREATE FUNCTION uuid_v7() RETURNS uuid
LANGUAGE sql VOLATILE AS $$
    SELECT encode(
        set_bit(set_bit(
            overlay(uuid_send(gen_random_uuid())
                    PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
                    FROM 1 FOR 6),
            52, 1), 53, 1),
        'hex')::uuid
$$;
