-- ARGV: owner. Returns {task fields, outstanding requests, 1 if a claim may take it over}
-- or nil.
local st, orphaned = live(now_ms())
if not st or not visible(ARGV[1]) then return false end
return {redis.call('HGETALL', KEYS[1]), redis.call('HGETALL', KEYS[2]), orphaned and 1 or 0}
