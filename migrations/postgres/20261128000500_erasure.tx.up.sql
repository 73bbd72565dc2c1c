-- Erasure (docs/api-contract.md §14) deletes the subscriber's row, so that lists, lookups,
-- totals and cursors forget it exactly as they forget nothing else, and keeps its events with
-- their personal data scrubbed out, among them the subscriber.erased event itself. Events
-- therefore outlive their subscriber: no foreign key ties them to its row any more.
ALTER TABLE subscriber_events DROP CONSTRAINT subscriber_events_subscriber_id_fkey;

--bun:split

-- An endpoint made without an events list was given every type there was, five then; the
-- sixth, subscriber.erased, is part of "every type" too. An endpoint that named all five
-- itself cannot be told apart, and gets it as well.
UPDATE webhook_endpoints SET events = left(events, -1) || ',"subscriber.erased"]'
WHERE strpos(events, '"subscriber.created"') > 0 AND strpos(events, '"subscriber.updated"') > 0
    AND strpos(events, '"subscriber.confirmation_sent"') > 0 AND strpos(events, '"subscriber.confirmed"') > 0
    AND strpos(events, '"subscriber.unsubscribed"') > 0 AND strpos(events, '"subscriber.erased"') = 0;
