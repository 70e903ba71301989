-- idem 0001: the record table of the store.
--
-- Scopes and keys are VARBINARY, so ids compare and sort by their bytes,
-- as idem lists them, whatever the server's collation. Times are
-- DATETIME(6) in UTC, written from the server's UTC_TIMESTAMP(6): TIMESTAMP
-- would end in 2038, before the longest retention idem keeps.

CREATE TABLE IF NOT EXISTS idem_records (
    scope           VARBINARY(512)  NOT NULL,
    `key`           VARBINARY(2048) NOT NULL,
    state           VARCHAR(16)     NOT NULL,
    fingerprint     VARBINARY(32)   NULL,
    attempt         INT UNSIGNED    NOT NULL,
    fence           BIGINT UNSIGNED NOT NULL,
    token           BINARY(16)      NULL,
    lease_until     DATETIME(6)     NULL,
    takeover        BOOLEAN         NOT NULL DEFAULT FALSE,
    response        LONGBLOB        NULL,
    failure_class   VARCHAR(16)     NULL,
    failure_message BLOB            NULL,
    created_at      DATETIME(6)     NOT NULL,
    updated_at      DATETIME(6)     NOT NULL,
    expires_at      DATETIME(6)     NOT NULL,
    PRIMARY KEY (scope, `key`),
    KEY idem_records_expires_at (expires_at),
    KEY idem_records_abandoned (scope, state, lease_until)
) ENGINE = InnoDB;
