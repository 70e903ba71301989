-- get(KEYS[1] record, ARGV[1] optional filter): the record's fields as a
-- flat name/value list (the step journal's 'j:' fields left out), or an
-- empty list when it is absent or past its retention deadline. With the
-- filter 'abandoned', also empty unless the record is in progress with a
-- lease that has run out (what the completer re-drives).
local key = KEYS[1]
local ex = redis.call('HGET', key, 'ex')
if not ex or tonumber(ex) <= now then
  return {}
end
if ARGV[1] == 'abandoned' then
  local st = redis.call('HMGET', key, 'st', 'lu')
  if st[1] ~= 'p' or tonumber(st[2]) > now then
    return {}
  end
end
local names = {'s', 'k', 'st', 'fp', 'at', 'fe', 'ca', 'ua', 'ex', 'tk', 'lu', 'rs', 'fc', 'fm'}
local values = redis.call('HMGET', key, unpack(names))
local out = {}
for i, name in ipairs(names) do
  if values[i] then
    out[#out + 1] = name
    out[#out + 1] = values[i]
  end
end
return out
