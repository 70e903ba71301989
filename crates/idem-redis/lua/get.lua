-- get(KEYS[1] record): the record's fields as a flat name/value list, or
-- an empty list when it is absent or past its retention deadline.
local key = KEYS[1]
local ex = redis.call('HGET', key, 'ex')
if not ex or tonumber(ex) <= now then
  return {}
end
return redis.call('HGETALL', key)
