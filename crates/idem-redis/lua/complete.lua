-- complete(KEYS[1] record; ARGV token, response, retention ms, grace ms):
-- 1 if stored, 0 if the lease was lost (nothing written).
local key = KEYS[1]
if not held(key, ARGV[1]) then
  return 0
end
local ex = now + tonumber(ARGV[3])
redis.call('HDEL', key, 'tk', 'lu', 'fc', 'fm')
redis.call('HSET', key, 'st', 'c', 'rs', ARGV[2], 'ua', int(now), 'ex', int(ex))
keep_until(key, ex, tonumber(ARGV[4]))
return 1
