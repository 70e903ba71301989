-- step_begin($1 scope, $2 key, $3 token, $4 step name, $5 attempt)
--
-- One statement. If the record is live and in progress under the token
-- (locked FOR SHARE, so no takeover commits in between), marks the step
-- started by the attempt unless it is done. Returns whether the lease
-- held and the step's earlier attempt and result, for the client to
-- answer Fresh, InDoubt or Done.
WITH rec AS (
    SELECT created_at FROM {schema}.idem_records
    WHERE scope = $1 AND key = $2 AND state = 'in_progress' AND token = $3
      AND expires_at > now()
    FOR SHARE
), prev AS (
    SELECT s.attempt, s.result FROM {schema}.idem_steps s JOIN rec ON s.generation = rec.created_at
    WHERE s.scope = $1 AND s.key = $2 AND s.name = $4
), marked AS (
    INSERT INTO {schema}.idem_steps AS s (scope, key, name, generation, attempt, result)
    SELECT $1, $2, $4, rec.created_at, $5, NULL FROM rec
    WHERE NOT EXISTS (SELECT 1 FROM prev WHERE prev.result IS NOT NULL)
    ON CONFLICT (scope, key, name) DO UPDATE
        SET generation = excluded.generation, attempt = excluded.attempt, result = NULL
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM rec) AS held,
       (SELECT attempt FROM prev) AS prev_attempt,
       (SELECT result FROM prev) AS prev_result
