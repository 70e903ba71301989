-- idem 0005: the transactional outbox (`idem_mysql::outbox::Outbox`):
-- messages a producer enqueues inside its own transaction, sent by a
-- dispatcher once that transaction committed.
--
-- A row is due from `due_at` (the server's clock); a dispatcher takes due
-- rows with one UPDATE … ORDER BY … LIMIT, moving `due_at` a lease ahead
-- and stamping `taken_by` with a token of its own, reads them back by that
-- token, sends them, and deletes the ones the broker confirmed (only while
-- they are still its own). A dispatcher that dies leaves its rows to come
-- due again when the lease ends.

CREATE TABLE IF NOT EXISTS idem_outbox (
    seq         BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    id          TEXT         NOT NULL,
    destination TEXT         NOT NULL,
    headers     LONGTEXT     NOT NULL,
    payload     LONGBLOB     NOT NULL,
    enqueued_at DATETIME(6)  NOT NULL,
    due_at      DATETIME(6)  NOT NULL,
    attempts    INT          NOT NULL DEFAULT 0,
    taken_by    BIGINT       NULL,
    KEY idem_outbox_due (due_at, seq),
    KEY idem_outbox_taken_by (taken_by)
) ENGINE = InnoDB;
