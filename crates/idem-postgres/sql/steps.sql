-- steps($1 scope, $2 key): the journal of a live record, by step name.
SELECT s.name, s.attempt, s.result
FROM {schema}.idem_steps s
JOIN {schema}.idem_records r
  ON r.scope = s.scope AND r.key = s.key AND r.created_at = s.generation
WHERE s.scope = $1 AND s.key = $2 AND r.expires_at > now()
ORDER BY s.name
