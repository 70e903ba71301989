-- purge($1 limit): at most $1 expired records, oldest first. Rows another
-- session holds are skipped rather than waited for, so a purge never
-- queues behind a claim and holds its locks only for one small batch.
DELETE FROM {schema}.idem_records
WHERE (scope, key) IN (
    SELECT scope, key FROM {schema}.idem_records
    WHERE expires_at <= now()
    ORDER BY expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED)
  AND expires_at <= now()
