-- inbox claim, part 2 (scope, key): the row as it stands, locked, so the
-- read sees the latest committed row whatever the isolation level.
SELECT claim, fingerprint, response FROM idem_inbox
WHERE scope = ? AND `key` = ?
LOCK IN SHARE MODE
