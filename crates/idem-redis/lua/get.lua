-- get(KEYS[1] record, ARGV[1] optional filter): the record's fields as a
-- flat name/value list (the step journal left out), or an empty list when
-- it is absent or past its retention deadline. With the filter
-- 'abandoned', also empty unless the record is in progress with a lease
-- that has run out (what the completer re-drives). With 'sync' (a read
-- under replica acknowledgements), the record is written again as it is,
-- so that the WAIT sent behind this script covers every earlier write to
-- it: Redis 7.2 and later move a connection's WAIT offset only after a
-- command of its own that propagated, so a read alone, on a connection
-- other than the writer's, would confirm a write no replica holds.
local key = KEYS[1]
local r = load(key)
if not r or r.ex <= now then
  return {}
end
if ARGV[1] == 'abandoned' and (r.st ~= 'p' or r.lu > now) then
  return {}
end
if ARGV[1] == 'sync' then
  if r.hash then
    redis.call('HSET', key, 'm', redis.call('HGET', key, 'm'))
  else
    redis.call('SET', key, redis.call('GET', key), 'KEEPTTL')
  end
end
local out = {'s', r.s, 'k', r.k, 'st', r.st, 'fp', r.fp, 'at', int(r.at),
  'fe', int(r.fe), 'ca', int(r.ca), 'ua', int(r.ua), 'ex', int(r.ex)}
local function add(name, value)
  out[#out + 1] = name
  out[#out + 1] = value
end
if r.st == 'p' then
  add('tk', r.tk)
  add('lu', int(r.lu))
elseif r.st == 'c' then
  add('rs', r.rs)
end
if r.fc ~= '' then
  add('fc', r.fc)
  add('fm', r.fm)
end
return out
