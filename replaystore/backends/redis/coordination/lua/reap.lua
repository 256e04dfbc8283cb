-- No ARGV. Applies the lapse rule, as any reader does. Returns nil if the
-- store holds nothing of the task, else {status, lease deadline (ms), 1 if a
-- claim may take it over, 1 if this call ended it failed}.
local now = now_ms()
local before = redis.call('HGET', KEYS[1], 'st')
local st, orphaned = live(now)
if not st then return false end
local ended = (not TERMINAL[before]) and TERMINAL[st]
return {st, tonumber(redis.call('HGET', KEYS[1], 'ls')), orphaned and 1 or 0, ended and 1 or 0}
