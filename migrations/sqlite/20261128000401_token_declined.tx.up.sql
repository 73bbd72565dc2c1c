-- See migrations/postgres/20261128000401_token_declined.tx.up.sql.
ALTER TABLE confirmation_tokens ADD COLUMN declined_at TIMESTAMP;
