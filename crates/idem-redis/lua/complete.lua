-- complete(record; token, response, retention ms, grace ms): 1 if stored,
-- 0 if the lease was lost (nothing written).
local function complete(key, token, response, retention, grace)
  if not held(key, token) then
    return 0
  end
  local ex = now + tonumber(retention)
  redis.call('HDEL', key, 'tk', 'lu', 'fc', 'fm')
  redis.call('HSET', key, 'st', 'c', 'rs', response, 'ua', int(now), 'ex', int(ex))
  keep_until(key, ex, tonumber(grace))
  return 1
end
