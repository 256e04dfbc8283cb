-- ARGV: status, payload field ('res', 'err' or ''), packed payload, has message, message.
-- Returns 1 if this call ended the task, 0 if it had already ended (or is gone).
local now = now_ms()
local st = live(now)
if not st or TERMINAL[st] then return 0 end
local field = nil
if ARGV[2] ~= '' then field = ARGV[2] end
local message = nil
if ARGV[4] == '1' then message = ARGV[5] end
finish(now, ARGV[1], field, ARGV[3], message)
return 1
