-- An NDJSON import line's attributes and tags (docs/api-contract.md §19.2): see the PostgreSQL
-- migration of the same name.
ALTER TABLE import_rows ADD COLUMN extra TEXT;
