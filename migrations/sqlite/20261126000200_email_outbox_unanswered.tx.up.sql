-- How many attempts at an email got no reply to the end of DATA (a timeout, a dropped
-- connection): the server may have taken each of them. After one such attempt the next one
-- that goes unanswered counts as sent, so that a server that never replies in time gets at
-- most two copies, whatever failures come between (docs/email.md).
ALTER TABLE email_outbox ADD COLUMN unanswered integer NOT NULL DEFAULT 0;
