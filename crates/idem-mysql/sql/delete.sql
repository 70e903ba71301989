-- delete, part 2 (scope, key): the record, expired or not.
DELETE FROM idem_records WHERE scope = ? AND `key` = ?
