-- steps(scope, key): the journal of a live record, by step name.
SELECT s.name, s.attempt, s.result
FROM idem_steps s
JOIN idem_records r ON r.scope = s.scope AND r.`key` = s.`key` AND r.created_at = s.generation
WHERE s.scope = ? AND s.`key` = ? AND r.expires_at > UTC_TIMESTAMP(6)
ORDER BY s.name
