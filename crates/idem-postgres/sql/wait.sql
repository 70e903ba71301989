-- wait($1 scope, $2 key): marks an in-progress record as waited on, so
-- that the write ending it announces it (migrations/0006_waiters.sql);
-- returns the announcement's payload, or no row when the record is not in
-- progress. The update takes the row's lock: a write ending the record at
-- the same moment either commits first (the update's re-check then finds
-- the record ended, and no row comes back) or waits for this to commit
-- (and sees `waited`). A record already marked is not written again: many
-- duplicates of one run do not queue on its row.
WITH cur AS (
    SELECT waited FROM {schema}.idem_records
    WHERE scope = $1 AND key = $2 AND state = 'in_progress'
), marked AS (
    UPDATE {schema}.idem_records SET waited = true
    WHERE scope = $1 AND key = $2 AND state = 'in_progress'
      AND NOT EXISTS (SELECT 1 FROM cur WHERE waited)
    RETURNING 1
)
SELECT '{schema}:' || encode(sha256(convert_to($1::text || E'\n' || $2::text, 'UTF8')), 'hex')
WHERE EXISTS (SELECT 1 FROM cur WHERE waited) OR EXISTS (SELECT 1 FROM marked)
