-- idem records: one row per (scope, key). See idem::contract.
CREATE TABLE idem_records (
    scope         TEXT    NOT NULL,
    key           TEXT    NOT NULL,
    -- 0 in progress, 1 completed, 2 failed, 3 released
    state         INTEGER NOT NULL,
    token         BLOB,              -- 16 bytes while in progress
    lease_until   INTEGER,           -- ms since the Unix epoch, while in progress
    response      BLOB,              -- while completed
    failure_class TEXT,              -- failed, or released by a retryable failure
    failure_msg   TEXT,
    fingerprint   BLOB,              -- 32 bytes, or NULL
    attempt       INTEGER NOT NULL,
    fence         INTEGER NOT NULL,
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL,
    expires_at    INTEGER NOT NULL,
    PRIMARY KEY (scope, key)
);

CREATE INDEX idem_records_expires_at ON idem_records (expires_at);

-- Store-wide values: the store's id (the high half of every token) and the
-- claim sequence (the low half, and the floor of every fencing number).
CREATE TABLE idem_meta (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
