-- idem 0002: the step journal. A step belongs to one generation of its
-- record (the record's created_at), so a record claimed anew after its
-- expiry starts with an empty journal.

CREATE TABLE IF NOT EXISTS idem_steps (
    scope      VARBINARY(512)  NOT NULL,
    `key`      VARBINARY(2048) NOT NULL,
    name       VARBINARY(128)  NOT NULL,
    generation DATETIME(6)     NOT NULL,
    attempt    INT UNSIGNED    NOT NULL,
    result     LONGBLOB        NULL,
    PRIMARY KEY (scope, `key`, name)
) ENGINE = InnoDB;
