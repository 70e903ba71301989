-- idem 0004: the memory of expired keys (idem::horizon). One row per key
-- whose completed or failed record was purged while the store remembers:
-- the first 8 bytes of the digest of scope and key (the row's id: a table
-- keyed by an integer packs about 170 rows to a page), the fingerprint's
-- first 8 bytes and the day the record expired; never the outcome.
-- Dropped a day at a time through the day index.
CREATE TABLE idem_horizon (
    digest      INTEGER PRIMARY KEY, -- big-endian, as a signed integer
    fingerprint INTEGER NOT NULL,    -- likewise
    day         INTEGER NOT NULL     -- days since the Unix epoch
);

CREATE INDEX idem_horizon_day ON idem_horizon (day);
