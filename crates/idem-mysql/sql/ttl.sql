-- ttl(scope, key, sha256 of a response): whole milliseconds a live record
-- completed with that response has left, by the server's clock (rounded
-- down, so a cache never outlives the record).
SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) DIV 1000
FROM idem_records
WHERE scope = ? AND `key` = ? AND expires_at > UTC_TIMESTAMP(6)
  AND state = 'completed' AND UNHEX(SHA2(response, 256)) = ?
