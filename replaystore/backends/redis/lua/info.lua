-- session_info: the bookkeeping, after age-based eviction. ARGV: max_events, max_age_ms
-- Returns false, or {epoch, top, floor, count, state...}
if redis.call('EXISTS', M) == 0 then return false end
trim(tonumber(arg(1)), tonumber(arg(2)), now_ms())
local meta = redis.call('HMGET', M, 'epoch', 'top', 'floor', 'count')
local out = {meta[1], meta[2], meta[3], meta[4]}
for _, tag in ipairs(all_tags()) do table.insert(out, redis.call('HGET', M, 's:' .. tag)) end
return out
