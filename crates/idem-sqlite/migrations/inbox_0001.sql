-- idem transactional inbox: written inside the caller's own transaction.
CREATE TABLE IF NOT EXISTS idem_inbox (
    scope       TEXT    NOT NULL,
    key         TEXT    NOT NULL,
    fingerprint BLOB,
    response    BLOB,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    PRIMARY KEY (scope, key)
);

CREATE INDEX IF NOT EXISTS idem_inbox_expires_at ON idem_inbox (expires_at);
