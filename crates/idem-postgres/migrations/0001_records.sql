-- idem 0001: the record table of the store, and the sequence its fencing
-- numbers come from. `{schema}` is replaced by the configured schema.
--
-- Text columns use the "C" collation so that ids sort by their bytes, as
-- idem lists them, whatever the database's default collation is.

CREATE SEQUENCE IF NOT EXISTS {schema}.idem_fence AS bigint;

CREATE TABLE IF NOT EXISTS {schema}.idem_records (
    scope           text COLLATE "C" NOT NULL,
    key             text COLLATE "C" NOT NULL,
    state           text        NOT NULL
                    CHECK (state IN ('in_progress', 'completed', 'failed', 'released')),
    fingerprint     bytea,
    attempt         integer     NOT NULL,
    fence           bigint      NOT NULL,
    token           bytea,
    lease_until     timestamptz,
    takeover        boolean     NOT NULL DEFAULT false,
    response        bytea,
    failure_class   text        CHECK (failure_class IN ('retryable', 'terminal', 'unknown')),
    failure_message bytea,  -- UTF-8; bytea because text cannot hold NUL
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    expires_at      timestamptz NOT NULL,
    PRIMARY KEY (scope, key)
);

CREATE INDEX IF NOT EXISTS idem_records_expires_at ON {schema}.idem_records (expires_at);
