-- ARGV: owner, the runners' channel prefix, task id, then key, packed response
-- pairs. Returns 1 if the task is known.
local now = now_ms()
local st = live(now)
if not st or not visible(ARGV[1]) then return 0 end
if TERMINAL[st] then return 1 end
local taken = 0
for i = 4, #ARGV - 1, 2 do
  if redis.call('HDEL', KEYS[2], ARGV[i]) == 1 then
    redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
    taken = taken + 1
  end
end
if taken > 0 then
  if redis.call('HLEN', KEYS[2]) == 0 then
    redis.call('HSET', KEYS[1], 'st', 'working')
    status_event(now)
  end
  touch(now)
  expire_with_task(KEYS[3])
  nudge(ARGV[2], ARGV[3])
end
return 1
