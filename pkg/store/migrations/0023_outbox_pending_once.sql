-- An outbox row waiting to be sent was indexed twice: by id alone and by
-- stream and id (outbox_pending_stream, the relays' index). Every row
-- written paid for both. The set-aside rows have their own index, so what
-- waits is found through outbox_pending_stream and outbox_set_aside, and
-- the first index goes.
DROP INDEX outbox_pending;
