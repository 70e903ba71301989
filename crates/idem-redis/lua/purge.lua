-- purge(KEYS[1] record): deletes the record and its journal if it is past
-- its retention deadline and the server clock has passed its fence (so a
-- later claim's fence, taken from the clock, is still higher). 1 if
-- deleted, else 0.
local key = KEYS[1]
local r = load(key)
if not r or r.ex > now or r.fe >= now_us then
  return 0
end
if r.j == 1 then
  redis.call('DEL', journal(key, r))
end
redis.call('DEL', key)
return 1
