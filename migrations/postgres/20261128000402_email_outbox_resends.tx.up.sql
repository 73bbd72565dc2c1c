-- A subscriber's confirmation emails by time, for the re-send limit of docs/api-contract.md
-- §12.3 (at most 3 within 24 hours, whatever became of them).
CREATE INDEX email_outbox_subscriber_created_idx ON email_outbox (subscriber_id, created_at);
