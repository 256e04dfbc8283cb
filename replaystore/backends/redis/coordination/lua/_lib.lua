-- Shared by every task script. KEYS[1]: the task hash; KEYS[2]: outstanding
-- input requests (key -> packed request); KEYS[3]: answers not yet handed to
-- the runner (key -> packed response); KEYS[4]: the task's retained events,
-- oldest first, in their stored form. All four carry the task's hash tag.
local TERMINAL = {completed = true, failed = true, cancelled = true}

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- lastUpdatedAt never goes back, even if the server clock does.
local function touch(now)
  local u = tonumber(redis.call('HGET', KEYS[1], 'u'))
  if now < u then now = u end
  redis.call('HSET', KEYS[1], 'u', now)
end


-- Keys created after the task expire with it.
local function expire_with_task(key)
  redis.call('PEXPIREAT', key, redis.call('HGET', KEYS[1], 'x'))
end

-- Events. The hash holds 'evn', the seq the next event gets, and the retention
-- fixed at creation: 'evc' events kept, 'eva' ms an event is kept (0: no
-- limit), 'evt' ms events are kept once the task ended (-1: no limit). The
-- list holds seq evn - LLEN .. evn - 1: dropping only from its head keeps
-- the retained range whole, so that range is all a cursor is judged on.
local function trim_events(now)
  local len = redis.call('LLEN', KEYS[4])
  local keep = tonumber(redis.call('HGET', KEYS[1], 'evc') or '1000')
  if len > keep then
    redis.call('LTRIM', KEYS[4], len - keep, -1)
    len = keep
  end
  local age = tonumber(redis.call('HGET', KEYS[1], 'eva') or '0')
  if age > 0 then
    while len > 0 do
      local at = tonumber(string.match(redis.call('LINDEX', KEYS[4], 0), '^(%d+):'))
      if at > now - age then break end
      redis.call('LPOP', KEYS[4])
      len = len - 1
    end
  end
end

-- Append one event (its seq: the next), apply retention, wake the readers
-- (PUBLISH on the list's own name: a hint, they read the list on a timer too).
local function append_event(now, entry)
  local seq = redis.call('HINCRBY', KEYS[1], 'evn', 1) - 1
  if redis.call('RPUSH', KEYS[4], entry) == 1 then expire_with_task(KEYS[4]) end
  trim_events(now)
  redis.call('PUBLISH', KEYS[4], seq)
  return seq
end

-- The task's status as an event, in the step that set it. A task failed as
-- lost stores no message: its reader names the error from the 'lost' flag.
local function status_event(now)
  local st = redis.call('HGET', KEYS[1], 'st')
  local message = redis.call('HGET', KEYS[1], 'msg') or ''
  local lost = redis.call('HGET', KEYS[1], 'lost')
  if lost then message = '\0lost:' .. lost end
  local attempt = redis.call('HGET', KEYS[1], 'att') or '1'
  append_event(now, now .. ':s:' .. st .. ':' .. attempt .. ':' .. message)
end

-- End the task: the terminal status, its payload, nothing outstanding any more;
-- its end is its last event, and its events are kept as long as 'evt' says.
local function finish(now, status, field, blob, message)
  redis.call('HDEL', KEYS[1], 'res', 'err', 'lost')
  redis.call('HSET', KEYS[1], 'st', status)
  if field ~= nil then redis.call('HSET', KEYS[1], field, blob) end
  if message ~= nil then redis.call('HSET', KEYS[1], 'msg', message) end
  touch(now)
  redis.call('DEL', KEYS[2], KEYS[3])
  status_event(now)
  local keep = tonumber(redis.call('HGET', KEYS[1], 'evt') or '-1')
  if keep == 0 then
    redis.call('DEL', KEYS[4])
  elseif keep > 0 and now + keep < tonumber(redis.call('HGET', KEYS[1], 'x')) then
    redis.call('PEXPIREAT', KEYS[4], now + keep)
  end
end

-- The task's status (nil if the store holds nothing of it), after ending it
-- failed if its runner's lease lapsed: whoever looks first decides, once.
-- A re-runnable task (its call stored, fewer runs started than allowed) stays
-- active instead, and the second value says a claim may take it over.
-- A lapse is judged twice, a lease apart: the first look only marks the task
-- suspect ('sus') and gives its runner one more lease ('lm' ms) to renew. A
-- store that stalled answers nobody, so the first look after a stall comes
-- after it, and a live runner renews before the second; only a runner that
-- stays silent a whole lease after a lapse was seen is judged stopped. A
-- released lease (the runner handed the task over) is suspect already.
local function live(now)
  local st = redis.call('HGET', KEYS[1], 'st')
  if not st then return nil end
  if not TERMINAL[st] and tonumber(redis.call('HGET', KEYS[1], 'ls')) <= now then
    local grace = tonumber(redis.call('HGET', KEYS[1], 'lm') or '0')
    local sus = redis.call('HGET', KEYS[1], 'sus')
    if grace > 0 and not sus then
      -- Seen more than a lease after it happened: no replica could look (every
      -- replica scans once a lease), so the store answered no one meanwhile.
      local late = now - tonumber(redis.call('HGET', KEYS[1], 'ls')) > grace
      redis.call('HSET', KEYS[1], 'sus', late and '2' or '1', 'ls', now + grace)
      return st, false
    end
    local runs = tonumber(redis.call('HGET', KEYS[1], 'att') or '1')
    local max_runs = tonumber(redis.call('HGET', KEYS[1], 'max') or '1')
    if runs < max_runs and redis.call('HEXISTS', KEYS[1], 'call') == 1 then
      return st, true
    end
    finish(now, 'failed', 'lost', sus == '2' and '2' or '1', nil)
    return 'failed'
  end
  return st, false
end

-- Tell the task's runner that a client changed the task: PUBLISH the task id
-- on the runner's channel (its name: the prefix given, then the runner). A
-- hint only: the runner reads the change at its next beat if this is lost.
local function nudge(channel_prefix, task_id)
  local runner = redis.call('HGET', KEYS[1], 'rn')
  if runner then redis.call('PUBLISH', channel_prefix .. runner, task_id) end
end

-- A task created with an owner is visible to that owner only ('' is no owner).
local function visible(owner)
  local own = redis.call('HGET', KEYS[1], 'own')
  return (not own) or own == owner
end
