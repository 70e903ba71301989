-- release(scope, key, token)
UPDATE idem_records SET
    state = 'released', token = NULL, lease_until = NULL, takeover = FALSE,
    failure_class = NULL, failure_message = NULL, updated_at = UTC_TIMESTAMP(6)
WHERE scope = ? AND `key` = ? AND state = 'in_progress' AND token = ?
  AND expires_at > UTC_TIMESTAMP(6)
