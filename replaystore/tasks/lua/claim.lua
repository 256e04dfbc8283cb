-- ARGV: runner, lease ms. Returns the stored call if this runner took the task over, or nil.
local now = now_ms()
local st, orphaned = live(now)
if not st or not orphaned then return false end
redis.call('HSET', KEYS[1], 'rn', ARGV[1], 'ls', now + tonumber(ARGV[2]), 'st', 'working')
redis.call('HINCRBY', KEYS[1], 'att', 1)
redis.call('DEL', KEYS[2], KEYS[3])
touch(now)
return redis.call('HGET', KEYS[1], 'call')
