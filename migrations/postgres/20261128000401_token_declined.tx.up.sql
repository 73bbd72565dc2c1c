-- declined_at marks the token whose decline link ("I did not sign up", docs/api-contract.md
-- §12.2) unsubscribed its subscriber, so that repeating it shows the same page again.
ALTER TABLE confirmation_tokens ADD COLUMN declined_at timestamptz;
