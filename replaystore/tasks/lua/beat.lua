-- ARGV: runner, lease ms. Returns {status, answers} or nil (gone, or another runner's).
local now = now_ms()
local st = live(now)
if not st or redis.call('HGET', KEYS[1], 'rn') ~= ARGV[1] then return false end
if TERMINAL[st] then return {st, {}} end
redis.call('HSET', KEYS[1], 'ls', now + tonumber(ARGV[2]))
local answers = redis.call('HGETALL', KEYS[3])
if #answers > 0 then redis.call('DEL', KEYS[3]) end
return {st, answers}
