-- idem 0011: the memory of expired keys (idem::horizon), and the schema's
-- settings. `idem_horizon` holds one row per key whose completed or failed
-- record was purged while the schema remembers: the first 8 bytes of the
-- digest of scope and key, the fingerprint's first 8 bytes (both as
-- big-endian signed integers) and the day the record expired; never the
-- outcome. Dropped a day at a time through the day index.
-- `idem_settings` keeps `remember_ms`, so every process on the schema
-- remembers alike.
CREATE TABLE IF NOT EXISTS {schema}.idem_horizon (
    digest      bigint  PRIMARY KEY,
    fingerprint bigint  NOT NULL,
    day         integer NOT NULL
);

CREATE INDEX IF NOT EXISTS idem_horizon_day ON {schema}.idem_horizon (day);

CREATE TABLE IF NOT EXISTS {schema}.idem_settings (
    name  text   PRIMARY KEY,
    value bigint NOT NULL
);
