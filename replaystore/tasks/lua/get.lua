-- ARGV: owner. Returns {task fields, outstanding requests} or nil.
local st = live(now_ms())
if not st or not visible(ARGV[1]) then return false end
return {redis.call('HGETALL', KEYS[1]), redis.call('HGETALL', KEYS[2])}
