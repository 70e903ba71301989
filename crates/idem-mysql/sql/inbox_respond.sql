-- inbox set_response(response, scope, key): never overwrites.
UPDATE idem_inbox SET response = ?
WHERE scope = ? AND `key` = ? AND response IS NULL AND expires_at > UTC_TIMESTAMP(6)
