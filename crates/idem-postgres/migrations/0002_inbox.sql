-- idem 0002: the transactional inbox. Rows are written inside the
-- caller's own transactions, so they commit or roll back with the
-- business writes.

CREATE TABLE IF NOT EXISTS {schema}.idem_inbox (
    scope       text COLLATE "C" NOT NULL,
    key         text COLLATE "C" NOT NULL,
    fingerprint bytea,
    response    bytea,
    created_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (scope, key)
);

CREATE INDEX IF NOT EXISTS idem_inbox_expires_at ON {schema}.idem_inbox (expires_at);
