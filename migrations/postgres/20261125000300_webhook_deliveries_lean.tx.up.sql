-- Every write queues its deliveries in its own statement, so each index and check on
-- webhook_deliveries is paid once per event and endpoint, by the write. Two indexes and the
-- foreign key to subscriber_events served nothing the workers run:
-- - the foreign key's check read and share-locked the event's row in every write; events are
--   never deleted but with their subscriber's newsletter, whose endpoints go with it, and a
--   claim joins the event anyway;
-- - webhook_deliveries_event_idx served only that foreign key's cascade;
-- - webhook_deliveries_due_idx served no query: the claim and the finish go through the
--   primary key and webhook_deliveries_endpoint_due_idx, and the queue gauges count every
--   pending row, which webhook_deliveries_endpoint_due_idx holds too.
ALTER TABLE webhook_deliveries DROP CONSTRAINT webhook_deliveries_event_id_fkey;

--bun:split

DROP INDEX webhook_deliveries_event_idx;

--bun:split

DROP INDEX webhook_deliveries_due_idx;
