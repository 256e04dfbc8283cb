-- ARGV: runner, the event's stored form without its time. Returns its seq, or nil
-- (nothing stored) unless that runner holds the task and it has not ended: a
-- run whose task was taken over, cancelled or ended never adds to its events.
-- The runner asking is alive: its lease is not judged.
if redis.call('HGET', KEYS[1], 'rn') ~= ARGV[1] then return false end
local st = redis.call('HGET', KEYS[1], 'st')
if not st or TERMINAL[st] then return false end
local now = now_ms()
return append_event(now, now .. ':e:' .. ARGV[2])
