-- extend(KEYS[1] record; ARGV token, lease ms, grace ms): the new lease
-- deadline (never earlier than the old one), or -1 if the lease was lost.
local key = KEYS[1]
local r = held(key, ARGV[1])
if not r then
  return -1
end
local lease_until = math.max(now + tonumber(ARGV[2]), tonumber(r[4]))
local ex = math.max(tonumber(r[3]), lease_until)
redis.call('HSET', key, 'lu', int(lease_until), 'ex', int(ex), 'ua', int(now))
keep_until(key, ex, tonumber(ARGV[3]))
return lease_until
