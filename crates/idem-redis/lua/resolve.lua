-- resolve(KEYS[1] record; ARGV step name, 'a' applied | 'n' not applied,
-- result): on a parked record (failed, outcome unknown) whose step is in
-- doubt, journals the finding and releases the record. Replies 'R'
-- released, 'P' not parked, 'S' step not in doubt.
local key = KEYS[1]
local r = load(key)
if not r or r.st ~= 'f' or r.fc ~= 'unknown' or r.ex <= now then
  return 'P'
end
local field = 'j:' .. ARGV[1]
local v = redis.call('HGET', key, field)
if not v or string.sub(v, 1, 1) ~= 's' then
  return 'S'
end
if ARGV[2] == 'a' then
  redis.call('HSET', key, field, 'd' .. ARGV[3])
else
  redis.call('HDEL', key, field)
end
r.st, r.ua, r.fc, r.fm = 'r', now, '', ''
save(key, r)
return 'R'
