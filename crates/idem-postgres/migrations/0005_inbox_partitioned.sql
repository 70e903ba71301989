-- idem 0005: the time-partitioned inbox layout (Inbox::partitioned). Rows
-- go to the range partition of their created_at; a partition whose range
-- is past and whose rows have all expired is detached and dropped, which
-- is the purge. PostgreSQL cannot enforce uniqueness of (scope, key)
-- across partitions, so the claim serialises each key on a transaction
-- advisory lock and checks every partition for a live row itself.
-- Partitions are made by Inbox::maintain, never by this migration.

CREATE TABLE IF NOT EXISTS {schema}.idem_inbox_p (
    scope       text COLLATE "C" NOT NULL,
    key         text COLLATE "C" NOT NULL,
    fingerprint bytea,
    response    bytea,
    created_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (scope, key, created_at)
) PARTITION BY RANGE (created_at);

CREATE INDEX IF NOT EXISTS idem_inbox_p_expires_at ON {schema}.idem_inbox_p (expires_at);

-- Who is maintaining the partitions (Inbox::maintain): one row, held as a
-- lease, so two maintainers never work side by side (their DDL would
-- deadlock) and one that dies or is cancelled holds nothing past `until`.
CREATE TABLE IF NOT EXISTS {schema}.idem_inbox_p_upkeep (
    id     boolean PRIMARY KEY DEFAULT true CHECK (id),
    holder bytea       NOT NULL,
    until  timestamptz NOT NULL
);
