-- close_session and teardown: delete the session and leave a tombstone.
-- ARGV: tombstone_json_prefix, tombstone_ttl_ms, nonce, expect_epoch, expect_top, expect_floor
-- With expect_epoch set, only the exact state the verdict was decided on is torn
-- down (compare-and-delete). The nonce makes a retry of a call that already ran
-- answer the same. Returns {1, tag...} (done; the tags' lists go next) or {0}.
local meta = redis.call('HMGET', M, 'epoch', 'top', 'floor')
if not meta[1] then
  local t = redis.call('GET', T)
  if t and string.find(t, '"id":"' .. arg(3) .. '"', 1, true) then return {1} end
  return {0}
end
if arg(4) ~= '' and (meta[1] ~= arg(4) or meta[2] ~= arg(5) or meta[3] ~= arg(6)) then
  return {0}
end
local out = {1}
for _, tag in ipairs(all_tags()) do table.insert(out, tag) end
for _, tag in ipairs(redis.call('SMEMBERS', G)) do table.insert(out, tag) end
redis.call('DEL', M, I, G, K, K2)
redis.call('SET', T, arg(1) .. ',"id":"' .. arg(3) .. '","at":' .. now_ms() .. '}',
           'PX', tonumber(arg(2)))
return out
