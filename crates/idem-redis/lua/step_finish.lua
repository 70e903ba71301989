-- finish_step(KEYS[1] record, KEYS[2] its journal; ARGV token, step name,
-- result): journals the result. 1 if written, 0 if the lease was lost.
local key = KEYS[1]
local r = held(key, ARGV[1])
if not r then
  return 0
end
journal_step(key, journaled(key, r), ARGV[2], 'd' .. ARGV[3])
return 1
