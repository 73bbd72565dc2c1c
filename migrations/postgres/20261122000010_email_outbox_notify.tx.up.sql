-- Wakes the email workers (LISTEN email_outbox) when confirmation emails are queued. The
-- notification is sent when the inserting transaction commits, once per statement, so a bulk
-- create of 100 subscribers wakes the workers once; workers poll as well, so a missed
-- notification only delays an email until the next poll.
CREATE FUNCTION email_outbox_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('email_outbox', '');
    RETURN NULL;
END
$$;

--bun:split

CREATE TRIGGER email_outbox_notify AFTER INSERT ON email_outbox
    FOR EACH STATEMENT EXECUTE FUNCTION email_outbox_notify();
