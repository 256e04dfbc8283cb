-- ARGV: runner, packed request... Returns the issued keys, or nil.
-- Only the runner holding the task asks, and it is alive: its lease is not judged.
if redis.call('HGET', KEYS[1], 'rn') ~= ARGV[1] then return false end
local st = redis.call('HGET', KEYS[1], 'st')
if not st or TERMINAL[st] then return false end
local keys = {}
for i = 2, #ARGV do
  local key = 'r' .. redis.call('HINCRBY', KEYS[1], 'n', 1)
  redis.call('HSET', KEYS[2], key, ARGV[i])
  keys[#keys + 1] = key
end
if #keys > 0 then
  redis.call('HSET', KEYS[1], 'st', 'input_required')
  local now = now_ms()
  touch(now)
  status_event(now)
  expire_with_task(KEYS[2])
end
return keys
