-- release(record; token): 1 if released, 0 if the lease was lost. The
-- retention deadline is unchanged.
local function release(key, token)
  if not held(key, token) then
    return 0
  end
  redis.call('HDEL', key, 'tk', 'lu', 'fc', 'fm')
  redis.call('HSET', key, 'st', 'r', 'ua', int(now))
  return 1
end
