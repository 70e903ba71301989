-- finish_step(KEYS[1] record; ARGV token, step name, result): journals the
-- result. 1 if written, 0 if the lease was lost.
local key = KEYS[1]
if not held(key, ARGV[1]) then
  return 0
end
redis.call('HSET', key, 'j:' .. ARGV[2], 'd' .. ARGV[3])
return 1
