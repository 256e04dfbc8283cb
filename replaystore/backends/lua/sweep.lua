-- sweep: drop evicted elements from the declared lists (tags in ARGV[2..]), and
-- delete lists whose sequence is gone. The newest evicted element of a list
-- stays: it proves a cursor at it continuous (facts.lua). Idempotent. No ARGV
-- of its own.
local live = redis.call('EXISTS', M) == 1
for tag, q in pairs(Q) do
  local s = live and load(tag)
  if not s then
    if live then redis.call('HINCRBY', M, 'gc', -redis.call('LLEN', q)) end
    redis.call('DEL', q)
  elseif s.first - 1 > s.base then
    redis.call('LTRIM', q, s.first - 1 - s.base, -1)
    redis.call('HINCRBY', M, 'gc', s.base - s.first + 1)
    s.base = s.first - 1
    save(tag, s)
  end
  if live then redis.call('SREM', G, tag) end
end
if live and redis.call('SCARD', G) == 0 then redis.call('HSET', M, 'gc', 0) end
return 1
