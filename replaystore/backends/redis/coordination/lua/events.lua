-- ARGV: owner, first seq wanted ('' for the earliest retained), most events.
-- Returns {status, next seq, retained count, events from the first wanted,
-- 1 if a claim may take the task over}, or nil (unknown, expired, another
-- owner's): the facts a cursor is judged on and the events, in one step.
local now = now_ms()
local st, orphaned = live(now)
if not st or not visible(ARGV[1]) then return false end
trim_events(now)
local next_seq = tonumber(redis.call('HGET', KEYS[1], 'evn') or '0')
local len = redis.call('LLEN', KEYS[4])
local floor = next_seq - len
local first = floor
if ARGV[2] ~= '' and tonumber(ARGV[2]) > floor then first = tonumber(ARGV[2]) end
local events = {}
local most = tonumber(ARGV[3])
if first < next_seq and most > 0 then
  events = redis.call('LRANGE', KEYS[4], first - floor, first - floor + most - 1)
end
return {st, next_seq, len, events, orphaned and 1 or 0}
