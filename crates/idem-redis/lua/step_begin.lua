-- begin_step(KEYS[1] record, KEYS[2] its journal; ARGV token, step name,
-- attempt). A step is a field of the record's journal (see the prelude),
-- named after the step. Its value is 's' .. attempt while started and 'd'
-- .. result once done.
-- Replies:
--   {'L'} lease lost | {'N'} fresh | {'I', attempt} in doubt | {'D', result} done
local key = KEYS[1]
local r = held(key, ARGV[1])
if not r then
  return {'L'}
end
local steps = journaled(key, r)
local v = redis.call('HGET', steps, ARGV[2])
if v and string.sub(v, 1, 1) == 'd' then
  return {'D', string.sub(v, 2)}
end
journal_step(key, steps, ARGV[2], 's' .. ARGV[3])
if v then
  return {'I', tonumber(string.sub(v, 2))}
end
return {'N'}
