-- append: store a batch of events of one sequence (its list is Q[tag]).
-- ARGV: tag, name, max_events, max_age_ms, session_ttl_ms, split_ms,
--       idempotency_key ('' for none), sweep_threshold, payload...
-- A payload is 'd' .. bytes, or 'p' for a priming event.
-- Returns false (no session), {epoch, 'collision'}, {epoch, 'dup', ids}, or
-- {epoch, 'ok', ids, sweep_tags, touch_tags}; ids = "pos.ordinal.stamp,..."
-- The common case runs five commands: HMGET, TIME, RPUSH, HSET, PTTL.
local tag, name = arg(1), arg(2)
local meta = redis.call('HMGET', M, 'epoch', 'top', 'floor', 'count', 'nseq', 'gc', 'lr',
                        's:' .. tag)
if not meta[1] then return false end -- unknown session: never resurrect one
local epoch = meta[1]
local key = arg(7)
if key ~= '' then
  local done = redis.call('HGET', K, key) or redis.call('HGET', K2, key)
  if done then return {epoch, 'dup', done} end
end
local top, count, nseq = tonumber(meta[2]), tonumber(meta[4]), tonumber(meta[5])
local s = parse_state(meta[8])
if s and s.name ~= name then return {epoch, 'collision'} end
local q = Q[tag]
local max_age, split = tonumber(arg(4)), tonumber(arg(6))
local run = run_of(meta[7])
local now = now_ms() -- every event's stamp
local new_list = not s
local want = 0 -- the list's length once this batch is in
if s then want = s.next - s.base end
local ids, batch = {}, {}
local pushed = nil
for j = A + 9, #AV do
  local a = AV[j]
  local priming = string.byte(a, 1) == 112 -- 'p'
  if s and priming and s.priming == 1 then
    -- only the newest of consecutive priming events is kept: hand out its id again
    table.insert(ids, s.hw .. '.' .. (s.next - 1) .. '.' .. s.stamp)
  else
    top = top + 1
    if not s then
      redis.call('DEL', q) -- leftovers of an earlier sequence of this name
      s = {hw = top, stamp = now, floor = top, first = 0, next = 0, base = 0, priming = 0,
           name = name}
      nseq = nseq + 1
    end
    if not run or run.tag ~= tag or run.ord + (top - run.pos) ~= s.next
        or (split > 0 and now - run.at >= split) then
      run = {pos = top, tag = tag, ord = s.next, at = now}
      pushed = top .. ',' .. tag .. ',' .. s.next .. ',' .. now
      if redis.call('RPUSH', I, pushed) == 1 then adopt(I) end
    end
    if priming then
      table.insert(batch, top .. ',' .. now)
    else
      table.insert(batch, top .. ',' .. now .. ':' .. string.sub(a, 2))
    end
    if #batch == 1000 then redis.call('RPUSH', q, unpack(batch)) batch = {} end
    table.insert(ids, top .. '.' .. s.next .. '.' .. now)
    s.next = s.next + 1
    want = want + 1
    s.hw = top
    s.stamp = now
    if priming then s.priming = 1 else s.priming = 0 end
    count = count + 1
  end
end
if #batch > 0 then
  local len = redis.call('RPUSH', q, unpack(batch))
  if len < want then
    -- the list was lost under live bookkeeping: hold the lost events' places,
    -- so that the new events sit at their ordinals (the lost ones read as missing)
    local lost = want - len
    while lost > 0 do
      local blanks = {}
      for j = 1, math.min(lost, 1000) do blanks[j] = '' end
      redis.call('LPUSH', q, unpack(blanks))
      lost = lost - #blanks
    end
  end
end
local evicted, floor, count2, nseq2, dirtied =
  evict(tonumber(arg(3)), max_age, now, top, meta[3], count, nseq, tag, s)
local fields = {'top', top, 'floor', floor, 'count', count2, 'nseq', nseq2}
if s.first < s.next then
  if s.first - s.base >= 64 then
    -- this sequence's own evicted head, dropped in place now and then
    redis.call('LTRIM', q, s.first - s.base, -1)
    s.base = s.first
  end
  table.insert(fields, 's:' .. tag)
  table.insert(fields, state_text(s))
end
if pushed then
  table.insert(fields, 'lr')
  table.insert(fields, pushed)
end
redis.call('HSET', M, unpack(fields))
mark_dirty(dirtied)
local gc = tonumber(meta[6] or '0') + dirtied
ids = table.concat(ids, ',')
if key ~= '' then
  if redis.call('HLEN', K) >= 1000 then redis.call('RENAME', K, K2) end
  redis.call('HSET', K, key, ids)
  adopt(K)
end
if new_list then adopt(q) end
local touch = refresh(tonumber(arg(5)))
return {epoch, 'ok', ids, sweep_due(tonumber(arg(8)), gc), touch}
