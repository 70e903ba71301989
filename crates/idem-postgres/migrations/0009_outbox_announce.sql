-- idem 0009: waking the outbox's dispatchers (`Outbox::run`). A statement
-- that enqueues announces it on `idem_done` with the payload
-- `<schema>:outbox` (no record's payload: theirs end in a 64-digit
-- digest). NOTIFY is transactional: the dispatchers hear it when the
-- producer's transaction commits, never for one rolled back, and
-- PostgreSQL folds a transaction's identical announcements into one.
-- Like every NOTIFY it takes a brief lock at commit that serializes the
-- committing transactions that announce; a producer that enqueues at
-- thousands of transactions a second and does not need the wake-up can
-- drop the trigger (the dispatchers then find messages by polling).

CREATE OR REPLACE FUNCTION {schema}.idem_outbox_announce() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_catalog.pg_notify('idem_done', TG_TABLE_SCHEMA || ':outbox');
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS idem_outbox_enqueued ON {schema}.idem_outbox;
CREATE TRIGGER idem_outbox_enqueued
    AFTER INSERT ON {schema}.idem_outbox
    FOR EACH STATEMENT
    EXECUTE FUNCTION {schema}.idem_outbox_announce();
