-- idem 0003: the step journal. One row per journaled step of a record.
-- `generation` is the record's created_at when the step was written: a
-- key claimed anew as a new record gets a new created_at, so rows of the
-- earlier record read as absent (and are overwritten) without the claim
-- statement having to touch this table. Rows go with their record when it
-- is deleted or purged.

CREATE TABLE IF NOT EXISTS {schema}.idem_steps (
    scope      text COLLATE "C" NOT NULL,
    key        text COLLATE "C" NOT NULL,
    name       text COLLATE "C" NOT NULL,
    generation timestamptz NOT NULL,
    attempt    integer     NOT NULL,  -- the attempt that last marked it started
    result     bytea,                 -- the journaled result once done; NULL while started
    PRIMARY KEY (scope, key, name),
    FOREIGN KEY (scope, key) REFERENCES {schema}.idem_records (scope, key) ON DELETE CASCADE
);
