-- fail(record; token, class, message, retention ms, grace ms): a retryable
-- failure releases the record, terminal and unknown ones are kept and
-- replayed. 1 if written, 0 if the lease was lost.
local function fail(key, token, class, message, retention, grace)
  if not held(key, token) then
    return 0
  end
  local st = 'f'
  if class == 'retryable' then
    st = 'r'
  end
  local ex = now + tonumber(retention)
  redis.call('HDEL', key, 'tk', 'lu')
  redis.call('HSET', key, 'st', st, 'fc', class, 'fm', message, 'ua', int(now), 'ex', int(ex))
  keep_until(key, ex, tonumber(grace))
  return 1
end
