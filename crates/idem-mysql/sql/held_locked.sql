-- held_locked(scope, key): the record, expired or not, locked until the
-- transaction ends (a claim that remembers expired keys weighs an expired
-- one still held; a purge dropping it commits its memory first).
SELECT {record} FROM idem_records WHERE scope = ? AND `key` = ? FOR UPDATE
