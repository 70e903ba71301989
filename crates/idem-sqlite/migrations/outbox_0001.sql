-- idem transactional outbox (`idem_sqlite::outbox::Outbox`): messages a
-- producer enqueues inside its own transaction, sent by a dispatcher once
-- that transaction committed. Times are Unix milliseconds on the clock of
-- the process that writes.
--
-- A row is due from `due_at`; a dispatcher takes due rows, moving
-- `due_at` a lease ahead and stamping `taken_by`, sends them in `seq`
-- order, and deletes the ones the broker confirmed (only while they are
-- still its own). A dispatcher that dies leaves its rows to come due again
-- when the lease ends. AUTOINCREMENT: a sequence number is never reused,
-- so enqueueing order survives deletes.
CREATE TABLE IF NOT EXISTS idem_outbox (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    id          TEXT    NOT NULL,
    destination TEXT    NOT NULL,
    headers     TEXT    NOT NULL DEFAULT '[]',
    payload     BLOB    NOT NULL,
    enqueued_at INTEGER NOT NULL,
    due_at      INTEGER NOT NULL,
    attempts    INTEGER NOT NULL DEFAULT 0,
    taken_by    INTEGER
);

CREATE INDEX IF NOT EXISTS idem_outbox_due ON idem_outbox (due_at, seq);
