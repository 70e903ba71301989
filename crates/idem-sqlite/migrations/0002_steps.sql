-- idem step journal: one row per journaled step of a record. A row lives
-- exactly as long as its record: the trigger below deletes it with the
-- record (delete, purge), and the writer deletes it when the key is
-- claimed as a new record. See idem::StepJournal.
CREATE TABLE idem_steps (
    scope   TEXT    NOT NULL,
    key     TEXT    NOT NULL,
    name    TEXT    NOT NULL,
    attempt INTEGER NOT NULL,  -- the attempt that last marked it started
    result  BLOB,              -- the journaled result once done; NULL while started
    PRIMARY KEY (scope, key, name)
) WITHOUT ROWID;

CREATE TRIGGER idem_records_drop_steps AFTER DELETE ON idem_records
BEGIN
    DELETE FROM idem_steps WHERE scope = old.scope AND key = old.key;
END;
