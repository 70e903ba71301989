-- inbox purge(limit): at most `limit` expired rows, oldest first.
DELETE FROM idem_inbox WHERE expires_at <= UTC_TIMESTAMP(6) ORDER BY expires_at LIMIT ?
