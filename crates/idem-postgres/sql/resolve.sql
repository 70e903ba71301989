-- resolve($1 scope, $2 key, $3 step name, $4 applied, $5 result)
--
-- One statement. On a parked record (live, failed with an unknown
-- outcome, locked FOR UPDATE) whose step is in doubt (started, not done):
-- journals the result if applied, removes the step's mark if not, and
-- releases the record. Returns 'R' released, 'P' not parked, 'S' step not
-- in doubt.
WITH rec AS (
    SELECT created_at, (state = 'failed' AND failure_class = 'unknown') AS parked
    FROM {schema}.idem_records
    WHERE scope = $1 AND key = $2 AND expires_at > now()
    FOR UPDATE
), step AS (
    SELECT 1 FROM {schema}.idem_steps s JOIN rec ON s.generation = rec.created_at
    WHERE s.scope = $1 AND s.key = $2 AND s.name = $3 AND s.result IS NULL AND rec.parked
), applied AS (
    UPDATE {schema}.idem_steps SET result = $5
    WHERE scope = $1 AND key = $2 AND name = $3 AND $4 AND EXISTS (SELECT 1 FROM step)
    RETURNING 1
), undone AS (
    DELETE FROM {schema}.idem_steps
    WHERE scope = $1 AND key = $2 AND name = $3 AND NOT $4 AND EXISTS (SELECT 1 FROM step)
    RETURNING 1
), released AS (
    UPDATE {schema}.idem_records
    SET state = 'released', failure_class = NULL, failure_message = NULL, updated_at = now()
    WHERE scope = $1 AND key = $2 AND EXISTS (SELECT 1 FROM step)
    RETURNING 1
)
SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM rec WHERE parked) THEN 'P'
            WHEN NOT EXISTS (SELECT 1 FROM step) THEN 'S'
            ELSE 'R' END
