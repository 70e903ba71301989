-- step_finish($1 scope, $2 key, $3 token, $4 step name, $5 result): one
-- row written if the record is live and in progress under the token,
-- none otherwise (the lease was lost).
WITH rec AS (
    SELECT created_at FROM {schema}.idem_records
    WHERE scope = $1 AND key = $2 AND state = 'in_progress' AND token = $3
      AND expires_at > now()
    FOR SHARE
)
INSERT INTO {schema}.idem_steps AS s (scope, key, name, generation, attempt, result)
SELECT $1, $2, $4, rec.created_at, 0, $5 FROM rec
ON CONFLICT (scope, key, name) DO UPDATE
    SET generation = excluded.generation, result = excluded.result
