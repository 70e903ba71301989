-- resolve(KEYS[1] record, KEYS[2] its journal; ARGV step name, 'a' applied
-- | 'n' not applied, result): on a parked record (failed, outcome unknown)
-- whose step is in doubt, journals the finding and releases the record.
-- Replies 'R' released, 'P' not parked, 'S' step not in doubt. A released
-- record is not remembered: its memory, written when it failed, goes.
local key = KEYS[1]
local r = load(key)
if not r or r.st ~= 'f' or r.fc ~= 'unknown' or r.ex <= now then
  return 'P'
end
if r.hash then
  save(key, r)
end
if r.j ~= 1 then
  return 'S'
end
local steps = journal(key, r)
local v = redis.call('HGET', steps, ARGV[1])
if not v or string.sub(v, 1, 1) ~= 's' then
  return 'S'
end
if ARGV[2] == 'a' then
  journal_step(key, steps, ARGV[1], 'd' .. ARGV[3])
else
  redis.call('HDEL', steps, ARGV[1])
end
r.st, r.ua, r.fc, r.fm = 'r', now, '', ''
save(key, r)
if declared(':h') then
  redis.call('DEL', key .. ':h')
end
return 'R'
