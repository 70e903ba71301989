-- complete(scope, key, token, response, retention ms)
UPDATE idem_records SET
    state = 'completed', response = ?, token = NULL, lease_until = NULL, takeover = FALSE,
    failure_class = NULL, failure_message = NULL, updated_at = UTC_TIMESTAMP(6),
    expires_at = UTC_TIMESTAMP(6) + INTERVAL ? * 1000 MICROSECOND
WHERE scope = ? AND `key` = ? AND state = 'in_progress' AND token = ?
  AND expires_at > UTC_TIMESTAMP(6)
