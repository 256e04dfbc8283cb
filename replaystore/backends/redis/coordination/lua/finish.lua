-- ARGV: status, payload field ('res', 'err' or ''), packed payload, has message, message,
-- runner ('' for none). Returns 1 if this call ended the task, 0 if it had already
-- ended (or is gone). With a runner, only while that runner holds the task (a run
-- whose task was taken over cannot end it), and without judging its lease: the
-- runner holding it is alive.
local now = now_ms()
local st
if ARGV[6] ~= nil and ARGV[6] ~= '' then
  if redis.call('HGET', KEYS[1], 'rn') ~= ARGV[6] then return 0 end
  st = redis.call('HGET', KEYS[1], 'st')
else
  st = live(now)
end
if not st or TERMINAL[st] then return 0 end
local field = nil
if ARGV[2] ~= '' then field = ARGV[2] end
local message = nil
if ARGV[4] == '1' then message = ARGV[5] end
finish(now, ARGV[1], field, ARGV[3], message)
return 1
