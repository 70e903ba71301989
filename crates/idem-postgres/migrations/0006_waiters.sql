-- idem 0006: waking the duplicates that wait for an in-flight record.
--
-- A waiter marks the in-progress record `waited` (sql/wait.sql) after it
-- LISTENs on `idem_done`; the write that ends the record (complete, fail,
-- release, or a delete while in progress) then announces it there, with
-- the schema and a digest of the record's id as the payload. Records
-- nobody waits on never reach the trigger function: the WHEN clause is
-- evaluated before any call, so the ending writes of the common case pay
-- nothing, and no NOTIFY (which serializes committing transactions) is
-- sent for them. The ending writes do not touch `waited` (a store whose
-- schema lacks this migration must still complete): a later attempt of a
-- once-waited record announces its end too, harmlessly.

ALTER TABLE {schema}.idem_records ADD COLUMN IF NOT EXISTS waited boolean NOT NULL DEFAULT false;

CREATE OR REPLACE FUNCTION {schema}.idem_announce_end() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_catalog.pg_notify('idem_done', TG_TABLE_SCHEMA || ':'
        || pg_catalog.encode(pg_catalog.sha256(
            pg_catalog.convert_to(OLD.scope || E'\n' || OLD.key, 'UTF8')), 'hex'));
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS idem_records_ended ON {schema}.idem_records;
CREATE TRIGGER idem_records_ended
    AFTER UPDATE ON {schema}.idem_records
    FOR EACH ROW
    WHEN (OLD.waited AND OLD.state = 'in_progress' AND NEW.state <> 'in_progress')
    EXECUTE FUNCTION {schema}.idem_announce_end();

DROP TRIGGER IF EXISTS idem_records_deleted ON {schema}.idem_records;
CREATE TRIGGER idem_records_deleted
    AFTER DELETE ON {schema}.idem_records
    FOR EACH ROW WHEN (OLD.waited AND OLD.state = 'in_progress')
    EXECUTE FUNCTION {schema}.idem_announce_end();
