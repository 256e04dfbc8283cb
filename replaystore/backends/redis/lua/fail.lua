-- fail: the teardown of a failed resume the fast read decided, where the
-- client cannot hold a WATCH across two packets (a cluster, a client the wire
-- does not handle; elsewhere teardown.py's transaction of native commands does
-- it for less), in as few commands as it takes (each redis.call costs Redis
-- more than the command sent directly).
-- ARGV: expect_epoch, condition, value, tombstone_json_prefix, tombstone_ttl_ms,
-- nonce, now_ms. The conditions are close.lua's: only the incarnation the
-- verdict was decided on is torn down, only while the condition still holds;
-- the nonce makes a retry of a call that already ran answer the same.
-- The fixed keys and the declared lists are deleted; the tags of the other
-- lists (the meta hash's sequences, the dirty set's) are returned, for the
-- client to delete later with drop.lua.
-- Returns {1, tag...} (done) or {0} (gone, or the verdict no longer holds).
local cond, value = arg(2), arg(3)
local meta = redis.call('HMGET', M, 'epoch', 'top', 'floor', 'nseq', 's:' .. value)
if not meta[1] then
  local t = redis.call('GET', T)
  if t and string.find(t, '"id":"' .. arg(6) .. '"', 1, true) then return {1} end
  return {0}
end
local holds = meta[1] == arg(1)
if not holds then return {0}
elseif cond == 'top_below' then holds = tonumber(meta[2]) < tonumber(value)
elseif cond == 'no_sequence' then holds = not meta[5]
elseif cond == 'ambiguous' then holds = tonumber(meta[3]) <= 1 and tonumber(meta[4]) > 1
elseif cond == 'floor_at_most' then holds = tonumber(meta[3]) <= tonumber(value)
end
if not holds then return {0} end
local out, seen = {1}, {}
for _, field in ipairs(redis.call('HKEYS', M)) do
  local tag = string.match(field, '^s:(%x+)$')
  if tag and not Q[tag] then out[#out + 1] = tag seen[tag] = true end
end
for _, tag in ipairs(redis.call('SMEMBERS', G)) do
  if not Q[tag] and not seen[tag] then out[#out + 1] = tag end
end
local keys = {M, I, G, K, K2, X}
for _, q in pairs(Q) do keys[#keys + 1] = q end
redis.call('DEL', unpack(keys)) -- one command: each redis.call costs more than a key
redis.call('SET', T, arg(4) .. ',"id":"' .. arg(6) .. '","at":' .. arg(7) .. '}', 'PX', arg(5))
return out
