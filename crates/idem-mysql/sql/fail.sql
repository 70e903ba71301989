-- fail(class, class, message, retention ms, scope, key, token): a
-- retryable failure releases the record; terminal and unknown ones are
-- kept.
UPDATE idem_records SET
    state = IF(? = 'retryable', 'released', 'failed'),
    failure_class = ?, failure_message = ?, token = NULL, lease_until = NULL,
    takeover = FALSE, updated_at = UTC_TIMESTAMP(6),
    expires_at = UTC_TIMESTAMP(6) + INTERVAL ? * 1000 MICROSECOND
WHERE scope = ? AND `key` = ? AND state = 'in_progress' AND token = ?
  AND expires_at > UTC_TIMESTAMP(6)
