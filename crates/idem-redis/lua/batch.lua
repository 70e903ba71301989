-- batch(KEYS: the record of each operation, in order; ARGV: the batch's
-- shared lease, retention, grace and memory, then for each operation its
-- code and its arguments): claims and holder writes that
-- callers made at the same time, run one after another as their own
-- scripts would run them. The reply has one entry per operation: what its
-- own script replies, or {'!', message} if it raised an error, in which
-- case the operations after it still run.
-- A batch runs on a single server only (never a Cluster), where touching
-- a journal or a memory no KEYS entry names is allowed.
all_declared = true
-- Made numbers once here rather than by each claim and completion.
local lease, retention, grace = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local memory = ARGV[4]
local ops = {
  c = {claim, 8},
  d = {complete, 5},
  f = {fail, 6},
  x = {extend, 3},
  r = {release, 1},
  p = {complete_pending, 6},
  o = {confirm, 1},
  -- A claim and a completion that take the batch's shared values
  -- (src/shared.rs).
  C = {function(key, token, fp, scope, name)
    return claim(key, token, fp, lease, retention, scope, name, grace, memory)
  end, 4},
  D = {function(key, token, response)
    return complete(key, token, response, retention, grace, memory)
  end, 2},
}
local out = {}
local at = 5
for i = 1, #KEYS do
  local op = ops[ARGV[at]]
  if not op then
    return redis.error_reply('batch: unknown operation ' .. tostring(ARGV[at]) .. ' at ' .. at)
  end
  local ok, reply = pcall(op[1], KEYS[i], unpack(ARGV, at + 1, at + op[2]))
  if not ok then
    if type(reply) == 'table' then
      reply = reply.err
    end
    reply = {'!', tostring(reply)}
  end
  out[i] = reply
  at = at + 1 + op[2]
end
return out
