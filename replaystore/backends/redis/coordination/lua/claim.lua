-- ARGV: runner, lease ms[, grace ms, tool...]. Returns the stored call if this
-- runner took the task over, or nil. With a grace, a task whose call names none
-- of the tools given is left to a replica that serves its tool until its lease
-- has been lapsed for the grace (then it is taken, to be failed as lost).
local now = now_ms()
local st, orphaned = live(now)
if not st or not orphaned then return false end
if #ARGV >= 3 then
  local name = redis.call('HGET', KEYS[1], 'tool')
  local served = false
  for i = 4, #ARGV do
    if ARGV[i] == name then served = true end
  end
  local lapsed = tonumber(redis.call('HGET', KEYS[1], 'ls'))
  if not served and now < lapsed + tonumber(ARGV[3]) then return false end
end
redis.call('HSET', KEYS[1], 'rn', ARGV[1], 'ls', now + tonumber(ARGV[2]), 'lm', ARGV[2],
  'st', 'working')
redis.call('HDEL', KEYS[1], 'sus')
redis.call('HINCRBY', KEYS[1], 'att', 1)
redis.call('DEL', KEYS[2], KEYS[3])
touch(now)
status_event(now)
return redis.call('HGET', KEYS[1], 'call')
