-- ARGV: runner, lease ms, ttl ms, poll ms ('' for none), owner ('' for none),
-- most runs, packed call to run again ('' for none), its tool's name ('' for none),
-- events kept, ms an event is kept (0: no limit), ms events are kept after the end (-1: no limit)
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local now = now_ms()
local ttl = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'st', 'working', 'c', now, 'u', now, 'ttl', ttl, 'x', now + ttl,
  'rn', ARGV[1], 'ls', now + tonumber(ARGV[2]), 'lm', ARGV[2], 'n', 0)
if ARGV[4] ~= '' then redis.call('HSET', KEYS[1], 'pi', ARGV[4]) end
if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], 'own', ARGV[5]) end
if ARGV[7] ~= '' then redis.call('HSET', KEYS[1], 'call', ARGV[7], 'att', 1, 'max', ARGV[6]) end
if ARGV[8] ~= nil and ARGV[8] ~= '' then redis.call('HSET', KEYS[1], 'tool', ARGV[8]) end
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('HSET', KEYS[1], 'evc', ARGV[9] or 1000, 'eva', ARGV[10] or 0, 'evt', ARGV[11] or -1)
status_event(now)
return now
