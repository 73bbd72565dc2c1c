-- API keys gain a scope (docs/api-contract.md §16.2): every key made before it could do every
-- operation, so every existing key is a write key. expires_at is set when a key is rotated:
-- from then on the key answers as a revoked one. last_used_at is written at most once a minute
-- per key, to the minute, outside the requests that use it.
ALTER TABLE api_keys ADD COLUMN scope TEXT NOT NULL DEFAULT 'write' CHECK (scope IN ('read', 'write'));

--bun:split

ALTER TABLE api_keys ADD COLUMN expires_at TIMESTAMP;

--bun:split

ALTER TABLE api_keys ADD COLUMN last_used_at TIMESTAMP;
