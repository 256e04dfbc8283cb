-- open_session: create the session with a fresh epoch, or refresh a live one.
-- ARGV: new_epoch, session_ttl_ms, max_events, max_age_ms
local ttl = tonumber(ARGV[2])
if redis.call('EXISTS', M) == 0 then
  -- Leftovers of an earlier incarnation (keys that outlived the meta hash)
  -- must not leak into this one: positions restart at 1.
  redis.call('DEL', E, N, T)
  redis.call('HSET', M, 'epoch', ARGV[1], 'top', 0, 'floor', 1, 'count', 0, 'nseq', 0)
else
  trim(tonumber(ARGV[3]), tonumber(ARGV[4]), now_ms())
end
expire_all(ttl)
return info()
