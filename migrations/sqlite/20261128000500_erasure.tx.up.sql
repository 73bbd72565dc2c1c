-- Events outlive their erased subscriber, and endpoints of every type get subscriber.erased:
-- see the PostgreSQL migration of this name. SQLite drops a foreign key by rebuilding the table.
CREATE TABLE subscriber_events_kept (
    id            TEXT PRIMARY KEY,
    newsletter_id TEXT      NOT NULL,
    subscriber_id TEXT      NOT NULL,
    type          TEXT      NOT NULL,
    payload       TEXT      NOT NULL,
    traceparent   TEXT      NOT NULL,
    created_at    TIMESTAMP NOT NULL
);

--bun:split

INSERT INTO subscriber_events_kept SELECT id, newsletter_id, subscriber_id, type, payload, traceparent, created_at
FROM subscriber_events;

--bun:split

DROP TABLE subscriber_events;

--bun:split

ALTER TABLE subscriber_events_kept RENAME TO subscriber_events;

--bun:split

CREATE INDEX subscriber_events_history_idx ON subscriber_events (subscriber_id, id);

--bun:split

UPDATE webhook_endpoints SET events = substr(events, 1, length(events) - 1) || ',"subscriber.erased"]'
WHERE instr(events, '"subscriber.created"') > 0 AND instr(events, '"subscriber.updated"') > 0
    AND instr(events, '"subscriber.confirmation_sent"') > 0 AND instr(events, '"subscriber.confirmed"') > 0
    AND instr(events, '"subscriber.unsubscribed"') > 0 AND instr(events, '"subscriber.erased"') = 0;
