-- sweep: drop evicted elements from the declared lists (tags in ARGV[2..]), and
-- delete lists whose sequence is gone. The newest evicted element of a list
-- stays: it proves a cursor at it continuous (facts.lua). Idempotent. No ARGV
-- of its own.
local live = redis.call('EXISTS', M) == 1
if not live then
  -- the session is gone: every declared list goes, in one command
  local lists = {}
  for _, q in pairs(Q) do lists[#lists + 1] = q end
  if #lists > 0 then redis.call('DEL', unpack(lists)) end
  return 1
end
for tag, q in pairs(Q) do
  local s = load(tag)
  if not s then
    redis.call('HINCRBY', M, 'gc', -redis.call('LLEN', q))
    redis.call('DEL', q)
  elseif s.first - 1 > s.base then
    redis.call('LTRIM', q, s.first - 1 - s.base, -1)
    redis.call('HINCRBY', M, 'gc', s.base - s.first + 1)
    s.base = s.first - 1
    save(tag, s)
  end
  redis.call('SREM', G, tag)
end
if redis.call('SCARD', G) == 0 then redis.call('HSET', M, 'gc', 0) end
return 1
