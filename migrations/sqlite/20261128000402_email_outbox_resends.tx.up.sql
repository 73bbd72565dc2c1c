-- See migrations/postgres/20261128000402_email_outbox_resends.tx.up.sql.
CREATE INDEX email_outbox_subscriber_created_idx ON email_outbox (subscriber_id, created_at);
