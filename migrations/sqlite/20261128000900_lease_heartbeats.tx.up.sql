-- When the worker holding a claimed email, or a webhook endpoint it delivers to, missed its
-- heartbeat: set at each claim and renewal to two beats ahead (a third of the lease each),
-- NULL when nobody holds it. Work whose stale_at has passed is held by a worker that stopped
-- renewing its lease (it died); the gauges *_held_past_heartbeat_seconds read it, and the
-- stall alerts fire on them (docs/operating.md).
ALTER TABLE email_outbox ADD COLUMN stale_at TIMESTAMP;

--bun:split

ALTER TABLE webhook_endpoints ADD COLUMN stale_at TIMESTAMP;
