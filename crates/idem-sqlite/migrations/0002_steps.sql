-- idem step journal: one row per journaled step of a record. A row lives
-- exactly as long as its record: deleted with it (delete, purge) and when
-- the key is claimed as a new record. See idem::StepJournal.
CREATE TABLE idem_steps (
    scope   TEXT    NOT NULL,
    key     TEXT    NOT NULL,
    name    TEXT    NOT NULL,
    attempt INTEGER NOT NULL,  -- the attempt that last marked it started
    result  BLOB,              -- the journaled result once done; NULL while started
    PRIMARY KEY (scope, key, name)
) WITHOUT ROWID;
