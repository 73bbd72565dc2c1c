-- Stored responses of idempotent writes (docs/api-contract.md §8), scoped to a newsletter. A
-- row is written in the same transaction as the change it answers, so the two exist together
-- or not at all; SQLite's immediate write transaction serialises requests with one key.
-- fingerprint is the SHA-256 of the method, path and the SHA-256 of the body; body is the
-- exact bytes sent.
CREATE TABLE idempotency_keys (
    newsletter_id TEXT      NOT NULL REFERENCES newsletters (id) ON DELETE CASCADE,
    key           TEXT      NOT NULL,
    fingerprint   BLOB      NOT NULL,
    status        INTEGER   NOT NULL,
    location      TEXT      NOT NULL,
    body          BLOB      NOT NULL,
    created_at    TIMESTAMP NOT NULL,
    expires_at    TIMESTAMP NOT NULL,
    PRIMARY KEY (newsletter_id, key)
);

--bun:split

CREATE INDEX idempotency_keys_expires_idx ON idempotency_keys (expires_at);

--bun:split

-- Secrets every instance shares, made once by the first instance that needs them (for
-- example the HMAC key of list cursors, docs/api-contract.md §9.2).
CREATE TABLE service_secrets (
    name       TEXT      PRIMARY KEY,
    value      BLOB      NOT NULL,
    created_at TIMESTAMP NOT NULL
);
