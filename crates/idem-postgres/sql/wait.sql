-- wait($1 scope, $2 key): marks an in-progress record as waited on, so
-- that the write ending it announces it (migrations/0006_waiters.sql);
-- returns the announcement's payload, or no row when the record is not in
-- progress. The update takes the row's lock: a write ending the record at
-- the same moment either commits first (and this finds the record ended)
-- or waits for this to commit (and sees `waited`).
UPDATE {schema}.idem_records SET waited = true
WHERE scope = $1 AND key = $2 AND state = 'in_progress'
RETURNING '{schema}:' || encode(sha256(convert_to(scope || E'\n' || key, 'UTF8')), 'hex')
