-- ARGV: owner, has message ('1' or ''), message, the runners' channel prefix,
-- task id. Returns 1 if the task is known.
local now = now_ms()
local st = live(now)
if not st or not visible(ARGV[1]) then return 0 end
if not TERMINAL[st] then
  local message = nil
  if ARGV[2] == '1' then message = ARGV[3] end
  finish(now, 'cancelled', nil, nil, message)
  nudge(ARGV[4], ARGV[5])
end
return 1
