-- idem 0008: the transactional outbox (`idem_postgres::Outbox`): messages
-- a producer enqueues inside its own transaction, sent by a dispatcher
-- once that transaction committed.
--
-- A row is due from `due_at`; a dispatcher takes due rows (FOR UPDATE SKIP
-- LOCKED), moving `due_at` a lease ahead and stamping `taken_by`, sends
-- them, and deletes the ones the broker confirmed (only while they are
-- still its own). A dispatcher that dies leaves its rows to come due
-- again when the lease ends.

CREATE TABLE IF NOT EXISTS {schema}.idem_outbox (
    seq         bigserial   PRIMARY KEY,
    id          text        NOT NULL,
    destination text        NOT NULL,
    headers     jsonb       NOT NULL DEFAULT '[]',
    payload     bytea       NOT NULL,
    enqueued_at timestamptz NOT NULL DEFAULT now(),
    due_at      timestamptz NOT NULL DEFAULT now(),
    attempts    integer     NOT NULL DEFAULT 0,
    taken_by    bigint
);

CREATE INDEX IF NOT EXISTS idem_outbox_due ON {schema}.idem_outbox (due_at, seq);
