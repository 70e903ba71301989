-- idem 0006: waking the duplicates that wait for an in-flight record.
--
-- A waiter marks the in-progress record `waited` (sql/wait.sql) after it
-- LISTENs on `idem_done`; the write that ends the record (complete, fail,
-- release, delete) then announces it there, with the schema and a digest
-- of the record's id as the payload. Records nobody waits on never reach
-- the trigger function: the WHEN clause is evaluated before any call, so
-- the ending writes of the common case pay nothing, and no NOTIFY (which
-- serializes committing transactions) is sent for them.

ALTER TABLE {schema}.idem_records ADD COLUMN IF NOT EXISTS waited boolean NOT NULL DEFAULT false;

CREATE OR REPLACE FUNCTION {schema}.idem_announce_end() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('idem_done', TG_TABLE_SCHEMA || ':'
        || encode(sha256(convert_to(OLD.scope || E'\n' || OLD.key, 'UTF8')), 'hex'));
    RETURN NULL;
END
$$;

CREATE TRIGGER idem_records_ended
    AFTER UPDATE ON {schema}.idem_records
    FOR EACH ROW WHEN (OLD.waited AND NEW.state <> 'in_progress')
    EXECUTE FUNCTION {schema}.idem_announce_end();

CREATE TRIGGER idem_records_deleted
    AFTER DELETE ON {schema}.idem_records
    FOR EACH ROW WHEN (OLD.waited)
    EXECUTE FUNCTION {schema}.idem_announce_end();
