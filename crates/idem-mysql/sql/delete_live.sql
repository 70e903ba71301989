-- delete, part 1 (scope, key): the record if it is live (one row changed:
-- a live record was there).
DELETE FROM idem_records WHERE scope = ? AND `key` = ? AND expires_at > UTC_TIMESTAMP(6)
