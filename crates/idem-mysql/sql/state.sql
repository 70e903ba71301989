-- state(scope, key): whether the record is in progress, for waiting
-- duplicates.
SELECT state = 'in_progress' AND expires_at > UTC_TIMESTAMP(6)
FROM idem_records WHERE scope = ? AND `key` = ?
