-- The index of running tasks (KEYS[1], a sorted set: task id -> the time, ms
-- on the server's clock, at which its lease may have lapsed). It is a hint
-- only: the task's own keys decide, in the task's own slot.
-- ARGV[1]: most ids to take; ARGV[2]: ms to hide taken ids from other scans;
-- ARGV[3]: number of corrections, then pairs (new time, or '' to drop; task id).
-- Applies the corrections, then takes the ids that are due (their time is
-- pushed ARGV[2] ms ahead, so concurrent scans take disjoint sets).
-- Returns {now, the earliest time left (or false if none), {ids taken...}}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = tonumber(ARGV[3])
for i = 0, n - 1 do
  local at, id = ARGV[4 + 2 * i], ARGV[5 + 2 * i]
  if at == '' then
    redis.call('ZREM', KEYS[1], id)
  else
    redis.call('ZADD', KEYS[1], 'XX', at, id)
  end
end
local due = {}
local limit = tonumber(ARGV[1])
if limit > 0 then
  due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, limit)
  local hidden = now + tonumber(ARGV[2])
  for _, id in ipairs(due) do redis.call('ZADD', KEYS[1], hidden, id) end
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {now, first[2] or false, due}
