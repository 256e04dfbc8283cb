-- open_session: create the session with a fresh epoch, or refresh a live one.
-- ARGV: new_epoch, session_ttl_ms, max_events, max_age_ms
-- Returns {epoch, top, floor, count, touch_tags, state...}
local ttl = tonumber(arg(2))
local touch = {}
if redis.call('EXISTS', M) == 0 then
  -- Leftovers of an earlier incarnation must not leak into this one. Sequence
  -- lists are reset when their sequence is created.
  redis.call('DEL', I, G, K, K2, T, X)
  redis.call('HSET', M, 'epoch', arg(1), 'top', 0, 'floor', 1, 'count', 0, 'nseq', 0, 'gc', 0)
  redis.call('PEXPIRE', M, ttl)
else
  trim(tonumber(arg(3)), tonumber(arg(4)), now_ms())
  touch = refresh(ttl)
end
local meta = redis.call('HMGET', M, 'epoch', 'top', 'floor', 'count')
local out = {meta[1], meta[2], meta[3], meta[4], touch}
for _, tag in ipairs(all_tags()) do table.insert(out, redis.call('HGET', M, 's:' .. tag)) end
return out
