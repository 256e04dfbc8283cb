-- ARGV: runner, lease ms. Returns {status, answers} or nil (gone, or another runner's).
-- The runner holding the task renews it even if its lease lapsed meanwhile
-- (a store stall): it is alive, which is all a lapse stands for. A lease of 0
-- releases the task: suspect at once, so the next look applies the lapse rule
-- (a re-runnable task is claimed by another replica without waiting, and the
-- run handed over does not count against its attempts).
local now = now_ms()
local st = redis.call('HGET', KEYS[1], 'st')
if not st or redis.call('HGET', KEYS[1], 'rn') ~= ARGV[1] then return false end
if TERMINAL[st] then return {st, {}} end
local lease = tonumber(ARGV[2])
if lease > 0 then
  redis.call('HSET', KEYS[1], 'ls', now + lease, 'lm', lease)
  redis.call('HDEL', KEYS[1], 'sus')
else
  redis.call('HSET', KEYS[1], 'ls', now, 'sus', 'r')
  -- A run handed over is no failed attempt: the next run does not count.
  if redis.call('HEXISTS', KEYS[1], 'call') == 1 then redis.call('HINCRBY', KEYS[1], 'max', 1) end
end
local answers = redis.call('HGETALL', KEYS[3])
if #answers > 0 then redis.call('DEL', KEYS[3]) end
return {st, answers}
