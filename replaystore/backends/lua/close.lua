-- close_session: delete the session and leave a tombstone. ARGV: tombstone_json, tombstone_ttl_ms
if redis.call('EXISTS', M) == 0 then return 0 end
redis.call('DEL', M, E, N)
redis.call('SET', T, ARGV[1], 'PX', tonumber(ARGV[2]))
return 1
