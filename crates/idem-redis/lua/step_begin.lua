-- begin_step(KEYS[1] record; ARGV token, step name, attempt). A step is the
-- record's field 'j:' .. name, so it lives and dies with the record's hash
-- (a new record starts from an empty hash). Its value is 's' .. attempt
-- while started and 'd' .. result once done. Replies:
--   {'L'} lease lost | {'N'} fresh | {'I', attempt} in doubt | {'D', result} done
local key = KEYS[1]
if not held(key, ARGV[1]) then
  return {'L'}
end
local field = 'j:' .. ARGV[2]
local v = redis.call('HGET', key, field)
if v and string.sub(v, 1, 1) == 'd' then
  return {'D', string.sub(v, 2)}
end
redis.call('HSET', key, field, 's' .. ARGV[3])
if v then
  return {'I', tonumber(string.sub(v, 2))}
end
return {'N'}
