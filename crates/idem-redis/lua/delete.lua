-- delete(KEYS[1] record; ARGV grace ms): the admin's force-release. The
-- record becomes a tombstone that reads as absent at once and keeps only
-- its fence until Redis drops it `grace` ms later. 1 if a live record was
-- there, else 0.
local key = KEYS[1]
local r = redis.call('HMGET', key, 'ex', 'fe')
if not r[1] then
  return 0
end
local live = 0
if tonumber(r[1]) > now then
  live = 1
end
redis.call('DEL', key)
redis.call('HSET', key, 'fe', r[2], 'ex', int(now))
keep_until(key, now, tonumber(ARGV[1]))
return live
