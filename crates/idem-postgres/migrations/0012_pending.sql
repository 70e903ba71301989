-- idem 0012: the outbox's pending index (`idem::store::PendingSends`): a
-- row per run whose messages are stored with its completion and not yet
-- confirmed sent, written by the completion's own statement
-- (sql/complete_pending.sql, sql/complete_many_pending.sql) and deleted
-- by the confirmation of the fence it was written with
-- (sql/pending_confirm.sql).
-- `held_until` is when its holder — the run's process, then a dispatcher
-- that took it (sql/pending_take.sql, sql/pending_take_run.sql) — lets
-- another take it.
--
-- A row names its run by key and fence only: a taker reads the record
-- and drops a row whose record moved on (expired, deleted, claimed
-- again). Such a row stays until a dispatcher takes it; it sends
-- nothing.

CREATE TABLE IF NOT EXISTS {schema}.idem_pending (
    scope      text COLLATE "C" NOT NULL,
    key        text COLLATE "C" NOT NULL,
    fence      bigint      NOT NULL,
    held_until timestamptz NOT NULL,
    PRIMARY KEY (scope, key)
);

-- No index beside the primary key: a taker (a dispatcher, every few
-- seconds) reads its scope's rows through the key's prefix, and the
-- confirmations, a few thousand a second, must find their rows by the
-- whole key (a second index led the planner to the scope alone).

-- Every row is inserted and deleted within moments: vacuumed at each of
-- autovacuum's rounds once a thousand are dead, whatever the table's size.
ALTER TABLE {schema}.idem_pending SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 1000
);

-- The confirmations of a batch, each row found by its primary key. A
-- statement joining the batch to the table is planned for the few rows
-- the table holds, as a scan of the whole table, which between two
-- vacuums holds every row deleted since: the confirmations would read
-- them all, at each batch.
CREATE OR REPLACE FUNCTION {schema}.idem_pending_confirm(
    scopes text[], keys text[], fences bigint[]
) RETURNS void LANGUAGE plpgsql SET enable_seqscan = off AS $$
BEGIN
    FOR i IN 1 .. coalesce(cardinality(keys), 0) LOOP
        DELETE FROM {schema}.idem_pending
        WHERE scope = scopes[i] AND key = keys[i] AND fence = fences[i];
    END LOOP;
END
$$;
