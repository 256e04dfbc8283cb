-- append: store a batch of events of one sequence (its list is Q[tag]).
-- ARGV: tag, name, max_events, max_age_ms, session_ttl_ms, split_ms,
--       idempotency_key ('' for none), sweep_threshold, payload...
-- A payload is 'd' .. bytes, or 'p' for a priming event.
-- Returns false (no session), {epoch, 'collision'}, {epoch, 'dup', ids}, or
-- {epoch, 'ok', ids, sweep_tags, touch_tags}; ids = "pos.ordinal,pos.ordinal,..."
local tag, name = arg(1), arg(2)
local meta = redis.call('HMGET', M, 'epoch', 'top', 'count', 'nseq', 's:' .. tag)
if not meta[1] then return false end -- unknown session: never resurrect one
local epoch = meta[1]
local key = arg(7)
if key ~= '' then
  local done = redis.call('HGET', K, key) or redis.call('HGET', K2, key)
  if done then return {epoch, 'dup', done} end
end
local now = now_ms()
local top, count, nseq = tonumber(meta[2]), tonumber(meta[3]), tonumber(meta[4])
local s = load(tag)
if s and s.name ~= name then return {epoch, 'collision'} end
local q = Q[tag]
local split = tonumber(arg(6))
local run = run_of(redis.call('LINDEX', I, -1))
local new_index, new_list = not run, not s
local ids, batch = {}, {}
if s then
  -- a list lost under live bookkeeping: hold the lost events' places, so that
  -- the new events land at their ordinals (the lost ones read as missing)
  local lost = s.next - s.base - redis.call('LLEN', q)
  while lost > 0 do
    local n = math.min(lost, 1000)
    local blanks = {}
    for j = 1, n do blanks[j] = '' end
    redis.call('RPUSH', q, unpack(blanks))
    lost = lost - n
  end
end
for j = A + 9, #ARGV do
  local a = ARGV[j]
  local priming = string.byte(a, 1) == 112 -- 'p'
  if s and priming and s.priming == 1 then
    -- only the newest of consecutive priming events is kept: hand out its id again
    table.insert(ids, s.hw .. '.' .. (s.next - 1))
  else
    top = top + 1
    if not s then
      redis.call('DEL', q) -- leftovers of an earlier sequence of this name
      s = {hw = top, floor = top, first = 0, next = 0, base = 0, priming = 0, name = name}
      nseq = nseq + 1
    end
    if not run or run.tag ~= tag or run.ord + (top - run.pos) ~= s.next
        or (split > 0 and now - run.at >= split) then
      run = {pos = top, tag = tag, ord = s.next, at = now}
      redis.call('RPUSH', I, top .. ',' .. tag .. ',' .. s.next .. ',' .. now)
    end
    if priming then
      table.insert(batch, tostring(top))
    else
      table.insert(batch, top .. ':' .. string.sub(a, 2))
    end
    if #batch == 1000 then redis.call('RPUSH', q, unpack(batch)) batch = {} end
    table.insert(ids, top .. '.' .. s.next)
    s.next = s.next + 1
    s.hw = top
    if priming then s.priming = 1 else s.priming = 0 end
    count = count + 1
  end
end
if #batch > 0 then redis.call('RPUSH', q, unpack(batch)) end
redis.call('HSET', M, 'top', top, 'count', count, 'nseq', nseq, 's:' .. tag, state_text(s))
trim(tonumber(arg(3)), tonumber(arg(4)), now)
-- this sequence's own list is declared: drop its evicted head right here
s = load(tag)
if s and s.first - s.base >= 64 then
  redis.call('LTRIM', q, s.first - s.base, -1)
  redis.call('HINCRBY', M, 'gc', s.base - s.first)
  s.base = s.first
  save(tag, s)
end
ids = table.concat(ids, ',')
if key ~= '' then
  if redis.call('HLEN', K) >= 1000 then redis.call('RENAME', K, K2) end
  redis.call('HSET', K, key, ids)
  adopt(K)
end
if new_list then adopt(q) end
if new_index then adopt(I) end
local touch = refresh(tonumber(arg(5)))
return {epoch, 'ok', ids, sweep_due(tonumber(arg(8))), touch}
