-- append: store a batch of events of one sequence; returns {epoch, first position}.
-- ARGV: sequence, max_events, max_age_ms, session_ttl_ms, payload...
local meta = redis.call('HMGET', M, 'epoch', 'top')
if not meta[1] then return false end -- unknown session: never resurrect one
local seq = ARGV[1]
local now = now_ms()
local top = tonumber(meta[2])
local first = top + 1
local hw = tonumber(redis.call('HGET', M, 'h:' .. seq) or '0')
if hw == 0 then
  redis.call('HSET', M, 'f:' .. seq, first)
  redis.call('HINCRBY', M, 'nseq', 1)
end
for i = 5, #ARGV do
  top = top + 1
  redis.call('XADD', E, top .. '-0', 's', seq, 'p', hw, 't', now, 'd', ARGV[i])
  if hw > 0 then redis.call('HSET', N, hw, top) end
  hw = top
end
local n = #ARGV - 4
redis.call('HSET', M, 'top', top, 'h:' .. seq, hw)
redis.call('HINCRBY', M, 'c:' .. seq, n)
redis.call('HINCRBY', M, 'count', n)
trim(tonumber(ARGV[2]), tonumber(ARGV[3]), now)
expire_all(tonumber(ARGV[4]))
return {meta[1], first}
