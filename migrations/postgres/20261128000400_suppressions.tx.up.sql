-- The suppression list (docs/api-contract.md §13): per newsletter, the addresses the service
-- never emails and the API cannot subscribe. email_key is the normalised address (trimmed,
-- lowercased) and email the address as given; both are NULL for an erased entry, of which only
-- email_hash, the SHA-256 of the normalised address, is kept. Every entry has its hash, so one
-- unique key holds "one per address" for erased and other entries alike, and a lookup by
-- address finds an erased entry through the hash. source is the entry's JSON source object.
CREATE TABLE suppressions (
    id            uuid PRIMARY KEY,
    newsletter_id uuid        NOT NULL REFERENCES newsletters (id) ON DELETE CASCADE,
    email         text,
    email_key     text,
    email_hash    bytea       NOT NULL,
    reason        text        NOT NULL CHECK (reason IN ('manual', 'hard_bounce', 'complaint', 'declined', 'erased')),
    source        text        NOT NULL,
    created_at    timestamptz NOT NULL,
    CONSTRAINT suppressions_newsletter_hash_key UNIQUE (newsletter_id, email_hash),
    CONSTRAINT suppressions_erased_no_email CHECK ((reason = 'erased') = (email IS NULL) AND (email IS NULL) = (email_key IS NULL))
);

--bun:split

-- The list order (newest first, id breaking ties), unfiltered and filtered by reason.
CREATE INDEX suppressions_list_idx ON suppressions (newsletter_id, created_at DESC, id DESC);

--bun:split

CREATE INDEX suppressions_reason_list_idx ON suppressions (newsletter_id, reason, created_at DESC, id DESC);
