-- idem 0006: the memory of expired keys (idem::horizon) and the
-- database's settings.
--
-- A store that remembers keeps, for each completed or failed record its
-- purge drops, the first 8 bytes of the key's digest and of the request's
-- fingerprint (as big-endian signed integers, as the PostgreSQL and SQLite
-- stores keep them) and the day the record expired; never the outcome.
-- Days past the memory are dropped a batch at a time by the purge.

CREATE TABLE IF NOT EXISTS idem_horizon (
    digest      BIGINT NOT NULL PRIMARY KEY,
    fingerprint BIGINT NOT NULL,
    day         INT    NOT NULL,
    KEY idem_horizon_day (day)
) ENGINE = InnoDB;

-- `remember_ms`: how long the memory keeps a key (0 or absent: off).
CREATE TABLE IF NOT EXISTS idem_settings (
    name  VARCHAR(64) NOT NULL PRIMARY KEY,
    value BIGINT      NOT NULL
) ENGINE = InnoDB;
