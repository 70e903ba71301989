-- delete(KEYS[1] record; ARGV grace ms): the admin's force-release. The
-- record becomes a tombstone that reads as absent at once and keeps only
-- its fence until Redis drops it `grace` ms later; its journal goes at
-- once, and so does its memory if it is live (a record past its
-- retention stays remembered). 1 if a live record was there, else 0.
local key = KEYS[1]
local r = load(key)
if not r then
  return 0
end
local live = 0
if r.j == 1 then
  redis.call('DEL', journal(key, r))
end
if r.ex > now then
  live = 1
  if declared(':h') then
    redis.call('DEL', key .. ':h')
  end
end
-- SET replaces a record kept as a hash too, its journal with it.
save(key, {st = 'x', at = 0, fe = r.fe, ca = now, ua = now, ex = now, lu = 0,
  tk = '', fp = '', fc = '', fm = '', s = '', k = '', g = r.g, w = 0, j = 0,
  rs = ''}, now + tonumber(ARGV[1]))
ended(key, r)
return live
