-- watch(KEYS[1] record): 1 if the record is in progress, after marking it
-- so that its end publishes (see `ended` in the prelude); else 0. A waiter
-- subscribes first and then watches, so an end after the watch reaches
-- it, and an end before it shows here.
local key = KEYS[1]
local r = load(key)
if not r or r.st ~= 'p' then
  return 0
end
if r.w ~= 1 then
  r.w = 1
  save(key, r)
end
return 1
