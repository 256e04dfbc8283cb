-- session_info: the bookkeeping, after age-based eviction. ARGV: max_events, max_age_ms
if redis.call('EXISTS', M) == 0 then return false end
trim(tonumber(ARGV[1]), tonumber(ARGV[2]), now_ms())
return info()
