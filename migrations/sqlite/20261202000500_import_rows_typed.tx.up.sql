-- Typed staged rows of an import, with the semantics of the PostgreSQL set
-- (migrations/postgres/20261202000500_import_rows_typed.tx.up.sql). SQLite cannot make a
-- column nullable in place: the table is rebuilt, its rows (staged by an older version, in
-- data) kept.
CREATE TABLE import_rows_typed (
    import_id  TEXT    NOT NULL,
    row_no     INTEGER NOT NULL,
    data       TEXT,
    email      TEXT,
    email_key  TEXT,
    email_hash BLOB,
    legacy_hash BLOB,
    first_name TEXT,
    last_name  TEXT,
    status     TEXT,
    errors     TEXT,
    duplicate  BOOLEAN NOT NULL DEFAULT FALSE,
    PRIMARY KEY (import_id, row_no)
) WITHOUT ROWID;

--bun:split

INSERT INTO import_rows_typed (import_id, row_no, data) SELECT import_id, row_no, data FROM import_rows;

--bun:split

DROP TABLE import_rows;

--bun:split

ALTER TABLE import_rows_typed RENAME TO import_rows;
