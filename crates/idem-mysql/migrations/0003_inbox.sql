-- idem 0003: the transactional inbox. Rows are written inside the
-- caller's own transactions, so they commit or roll back with the
-- business writes. `claim` is a random value each claim writes, so the
-- claim can tell its own row from a duplicate's without relying on the
-- connection's affected-rows flag.

CREATE TABLE IF NOT EXISTS idem_inbox (
    scope       VARBINARY(512)  NOT NULL,
    `key`       VARBINARY(2048) NOT NULL,
    claim       BINARY(16)      NOT NULL,
    fingerprint VARBINARY(32)   NULL,
    response    LONGBLOB        NULL,
    created_at  DATETIME(6)     NOT NULL,
    expires_at  DATETIME(6)     NOT NULL,
    PRIMARY KEY (scope, `key`),
    KEY idem_inbox_expires_at (expires_at)
) ENGINE = InnoDB;
