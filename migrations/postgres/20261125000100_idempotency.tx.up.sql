-- Stored responses of idempotent writes (docs/api-contract.md §8), scoped to a newsletter. A
-- row is written in the same transaction as the change it answers, so the two exist together
-- or not at all; a request in progress holds a transaction-scoped advisory lock instead of a
-- row, which a crash or a lost connection releases at once. fingerprint is the SHA-256 of the
-- method, path and the SHA-256 of the body; body is the exact bytes sent.
CREATE TABLE idempotency_keys (
    newsletter_id uuid        NOT NULL REFERENCES newsletters (id) ON DELETE CASCADE,
    key           text        NOT NULL,
    fingerprint   bytea       NOT NULL,
    status        integer     NOT NULL,
    location      text        NOT NULL,
    body          bytea       NOT NULL,
    created_at    timestamptz NOT NULL,
    expires_at    timestamptz NOT NULL,
    PRIMARY KEY (newsletter_id, key)
);

--bun:split

-- The background purge walks expired records in small batches.
CREATE INDEX idempotency_keys_expires_idx ON idempotency_keys (expires_at);

--bun:split

-- Secrets every instance shares, made once by the first instance that needs them (for
-- example the HMAC key of list cursors, docs/api-contract.md §9.2).
CREATE TABLE service_secrets (
    name       text        PRIMARY KEY,
    value      bytea       NOT NULL,
    created_at timestamptz NOT NULL
);
