-- purge(limit): at most `limit` expired records, oldest first. A row a
-- claim is taking over is waited for, then read again, and kept.
DELETE FROM idem_records WHERE expires_at <= UTC_TIMESTAMP(6) ORDER BY expires_at LIMIT ?
