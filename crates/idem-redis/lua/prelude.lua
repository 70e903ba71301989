-- Shared by every idem script (prepended when the scripts are built).
--
-- A record is one hash. Fields: s scope, k key, st state (p in progress,
-- c completed, f failed, r released), fp fingerprint hex ('' for none),
-- at attempt, fe fence, ca created ms, ua updated ms, ex retention
-- deadline ms, tk token hex and lu lease deadline ms (in progress only),
-- rs response (completed only), fc/fm failure class and message (failed,
-- and released by a retryable failure).
--
-- Time is the server's. Numbers are formatted with '%d' because Lua's
-- default formatting would round integers above 10^14.

local tm = redis.call('TIME')
local now_us = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
local now = math.floor(now_us / 1000)

local function int(n)
  return string.format('%d', n)
end

-- The record stays in Redis `grace` ms past its retention deadline, so its
-- fence is still there to build on when the key is claimed again; Redis
-- reclaims the memory afterwards. Expiry itself is decided here, at read.
local function keep_until(key, ex, grace)
  redis.call('PEXPIREAT', key, int(ex + grace))
end

-- The fields a holder's write checks, or nil when the record does not
-- carry `token` in a live lease (taken over, finished, deleted, expired).
local function held(key, token)
  local r = redis.call('HMGET', key, 'st', 'tk', 'ex', 'lu')
  if r[1] ~= 'p' or r[2] ~= token or tonumber(r[3]) <= now then
    return nil
  end
  return r
end
