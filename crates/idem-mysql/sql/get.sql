-- get(scope, key): a live record.
SELECT {record} FROM idem_records
WHERE scope = ? AND `key` = ? AND expires_at > UTC_TIMESTAMP(6)
