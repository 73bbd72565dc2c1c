-- has_attr's index on a built-in expression. The index of migration 20261202000600 was on
-- subscriber_attribute_keys(attributes), an SQL function that PostgreSQL runs through its
-- function executor for every row written with attributes: in a create with 5 attributes it
-- cost more than the other two GIN indexes together. jsonb_path_query_array with
-- '$.keyvalue().key' lists the same keys as a JSON array, in C; has_attr=a,b is its
-- containment of ["a","b"], which jsonb_path_ops answers as it answers attr[…].
--
-- Not in a transaction: the index is built CONCURRENTLY, so that writes go on while it is
-- built on a large table. Each statement can run again: a build that failed leaves an invalid
-- index, which the first statement drops. subscriber_attribute_keys stays for an instance of
-- the previous version still answering has_attr during a rolling upgrade.

DROP INDEX CONCURRENTLY IF EXISTS subscribers_attribute_names_idx;

--bun:split

CREATE INDEX CONCURRENTLY subscribers_attribute_names_idx
    ON subscribers USING gin (jsonb_path_query_array(attributes, '$.keyvalue().key') jsonb_path_ops)
    WHERE attributes <> '{}';

--bun:split

DROP INDEX CONCURRENTLY IF EXISTS subscribers_attribute_keys_idx;
