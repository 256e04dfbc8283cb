-- ARGV: runner, the event's stored form without its time, the runner's key for
-- this append ('' for none). Returns its seq, or nil (nothing stored) unless
-- that runner holds the task and it has not ended: a run whose task was taken
-- over, cancelled or ended never adds to its events. The runner asking is
-- alive: its lease is not judged. An append sent again under the key of the
-- last one ('evk', its seq 'evs') is answered with that seq, not stored twice.
if redis.call('HGET', KEYS[1], 'rn') ~= ARGV[1] then return false end
local st = redis.call('HGET', KEYS[1], 'st')
if not st or TERMINAL[st] then return false end
local key = ARGV[1] .. ':' .. ARGV[3]
if ARGV[3] ~= '' and redis.call('HGET', KEYS[1], 'evk') == key then
  return tonumber(redis.call('HGET', KEYS[1], 'evs'))
end
local now = now_ms()
local seq = append_event(now, now .. ':e:' .. ARGV[2])
redis.call('HSET', KEYS[1], 'evk', key, 'evs', seq)
return seq
