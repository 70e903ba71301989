-- fail(KEYS[1] record; ARGV token, class, message, retention ms, grace ms):
-- a retryable failure releases the record, terminal and unknown ones are
-- kept and replayed. 1 if written, 0 if the lease was lost.
local key, class = KEYS[1], ARGV[2]
if not held(key, ARGV[1]) then
  return 0
end
local st = 'f'
if class == 'retryable' then
  st = 'r'
end
local ex = now + tonumber(ARGV[4])
redis.call('HDEL', key, 'tk', 'lu')
redis.call('HSET', key, 'st', st, 'fc', class, 'fm', ARGV[3], 'ua', int(now), 'ex', int(ex))
keep_until(key, ex, tonumber(ARGV[5]))
return 1
