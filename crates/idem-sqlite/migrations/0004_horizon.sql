-- idem 0004: the memory of expired keys (idem::horizon). One row per key
-- whose completed or failed record was purged while the store remembers:
-- a digest of scope and key, the fingerprint's first bytes and the day the
-- record expired; never the outcome. Dropped a day at a time.
CREATE TABLE idem_horizon (
    digest      BLOB    NOT NULL PRIMARY KEY, -- 16 bytes
    fingerprint BLOB    NOT NULL,             -- 8 bytes
    day         INTEGER NOT NULL              -- days since the Unix epoch
) WITHOUT ROWID;

CREATE INDEX idem_horizon_day ON idem_horizon (day);
