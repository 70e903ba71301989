-- idem 0012: the outbox's pending index (`idem::store::PendingSends`): a
-- row per run whose messages are stored with its completion and not yet
-- confirmed sent, written by the completion's own statement
-- (sql/complete_pending.sql, sql/complete_many_pending.sql) and deleted
-- by the confirmation of the fence it was written with (sql/confirm.sql).
-- `held_until` is when its holder — the run's process, then a dispatcher
-- that took it (sql/pending_take.sql) — lets another take it.
--
-- A row names its run by key and fence only: a taker reads the record
-- and drops a row whose record moved on (expired, deleted, claimed
-- again), so the row never outlives what it points to in effect.

CREATE TABLE IF NOT EXISTS {schema}.idem_pending (
    scope      text COLLATE "C" NOT NULL,
    key        text COLLATE "C" NOT NULL,
    fence      bigint      NOT NULL,
    held_until timestamptz NOT NULL,
    PRIMARY KEY (scope, key)
);

CREATE INDEX IF NOT EXISTS idem_pending_due
    ON {schema}.idem_pending (scope, held_until);
