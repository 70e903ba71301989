-- pending_take(KEYS[1] record, its mark declared beside it; ARGV[1] hold ms): the
-- run, if its mark (pending.lua) is there and its hold ran out, held now
-- for ARGV[1] ms more: {scope, key, fence, response}. An empty list when
-- there is no mark, or it is held; a mark whose record is no longer the
-- completion it names is deleted, and the answer is empty.
local key = KEYS[1]
local mark = pending_key(key)
local v = redis.call('GET', mark)
if not v then
  return {}
end
local fence, held_until = string.match(v, '^(%d+):(%d+)$')
if not fence then
  redis.call('DEL', mark)
  return {}
end
if tonumber(held_until) > now then
  return {}
end
local r = load(key)
if not r or r.st ~= 'c' or int(r.fe) ~= fence or r.ex <= now then
  redis.call('DEL', mark)
  return {}
end
redis.call('SET', mark, fence .. ':' .. int(now + tonumber(ARGV[1])), 'KEEPTTL')
return {r.s, r.k, fence, r.rs}
