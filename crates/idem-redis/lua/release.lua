-- release(KEYS[1] record; ARGV token): 1 if released, 0 if the lease was
-- lost. The retention deadline is unchanged.
local key = KEYS[1]
if not held(key, ARGV[1]) then
  return 0
end
redis.call('HDEL', key, 'tk', 'lu', 'fc', 'fm')
redis.call('HSET', key, 'st', 'r', 'ua', int(now))
return 1
