-- The email workers poll for due rows instead of being notified, as the webhook workers do.
-- A NOTIFY takes a lock that serialises the commits of every notifying transaction, so each
-- pending create waited for the others' commits; and it woke the worker of every instance on
-- the database, each claiming for the one row only one of them could take.
DROP TRIGGER email_outbox_notify ON email_outbox;

--bun:split

DROP FUNCTION email_outbox_notify();
