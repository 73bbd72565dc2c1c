-- Lanes (docs/api-contract.md §21, outbox.Lane): the emails and webhook deliveries a single
-- API call or page caused (lane 0, interactive) are claimed before those of imports and bulk
-- actions (lane 1, bulk), and within the bulk lane the newsletters take turns. The writer
-- sets the lane; what was queued before is interactive.
ALTER TABLE email_outbox ADD COLUMN lane smallint NOT NULL DEFAULT 0;
ALTER TABLE webhook_deliveries ADD COLUMN lane smallint NOT NULL DEFAULT 0;

-- The interactive claim walks its lane in due order. The bulk claim finds the newsletters with
-- pending bulk emails (one probe each) and takes the first due ones of each in turn. One index
-- per lane: with a bulk lane in an index ordered by time alone, PostgreSQL read a newsletter's
-- first bulk emails from it, past every other newsletter's older ones.
DROP INDEX email_outbox_due_idx;
CREATE INDEX email_outbox_interactive_due_idx ON email_outbox (next_attempt_at) WHERE state = 'pending' AND lane = 0;
CREATE INDEX email_outbox_bulk_due_idx ON email_outbox (newsletter_id, next_attempt_at) WHERE state = 'pending' AND lane = 1;

-- An endpoint's claim reads its interactive deliveries first, then its bulk ones, each in due
-- order; the test of a due endpoint probes each lane's first.
DROP INDEX webhook_deliveries_endpoint_due_idx;
CREATE INDEX webhook_deliveries_endpoint_due_idx ON webhook_deliveries (endpoint_id, lane, next_attempt_at) WHERE state = 'pending';
