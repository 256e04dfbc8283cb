-- append: store a batch of events of one sequence (its list, the one list
-- declared: Q[tag]).
-- ARGV (after the list's count and tag): name, settings, fence, kinds,
--       idempotency_key ('' for none), payload...; or name, settings, fence,
--       payload for one data event without an idempotency key. fence: '' or
--       the epoch and the highest position this client was handed in the
--       session (see regressed in _lib.lua).
-- settings is "max_events,sweep_threshold,split_ms,max_age_ms,session_ttl_ms,
-- tombstone_ttl_ms,<tombstone>" (the tombstone: JSON without its end), one
-- argument rather than seven: every argument costs Redis time to read and to
-- hand to Lua, and an append's own work is small.
-- kinds is '' when every payload is an event's data, otherwise one character
-- per payload: 'd' (data) or 'p' (a priming event, its payload argument '').
-- The arguments that stay the same for a sequence come first, so that the
-- client can keep them packed.
-- Returns false (no session), {epoch, 'collision'}, {epoch, 'dup', ids},
-- {epoch, 'ok' or 'full', ids[, sweep_tags, touch_tags]} (ids =
-- "pos.ordinal.stamp,..."; 'full': stored, and the session is at max_events,
-- so its next append evicts: not worth trying append_lean.lua first), or
-- {epoch, 'lost', tag...}: the run index was lost, retention can no longer be
-- kept in order, and the session was torn down (the other tags' lists go
-- next), or {epoch, 'regressed'}: the session's high-water is below the
-- fence (the store lost appends it had acknowledged), nothing stored: the
-- client ends the session rather than have those positions issued again.
-- The common append (one data event, nothing evicted, swept or refreshed:
-- append_common in _lib.lua) comes as append_lean.lua where the client
-- expects it; this is every other append, and takes the common one too.
local tag, name = AV[2], arg(1)
-- One data event without an idempotency key (the common case) comes as
-- name, settings, payload: every argument costs Redis time to read and to
-- hand to Lua. Any other append has at least five arguments.
local short = #AV == A + 4
local kinds, key, at = '', '', A + 4 -- at: the first payload
if not short then kinds, key, at = arg(4), arg(5), A + 6 end
local field = 's:' .. tag
local meta = redis.call('HMGET', M, 'epoch', 'top', 'count', 'gc', field, 'rf', 'floor', 'nseq',
                        'lr', 'ra')
if not meta[1] then return false end -- unknown session: never resurrect one
local epoch = meta[1]
if regressed(arg(3), epoch, meta[2]) then return {epoch, 'regressed'} end
if key ~= '' then
  local done = redis.call('HGET', K, key) or redis.call('HGET', K2, key)
  if done then return {epoch, 'dup', done} end
end
if short then
  -- the common append, as append_lean.lua does it (a client that did not
  -- expect it sent this form: its first append to the sequence, say)
  local cap, sweep_at = string.match(arg(2), '^(%d+),(%d+),0,') -- split_ms 0
  if cap then
    local done = append_common(field, name, cap, sweep_at, AV[at], meta, Q[tag])
    if done then return done end
  end
end
local s = parse_state(meta[5])
if s and s.name ~= name then return {epoch, 'collision'} end
local top, count, nseq = tonumber(meta[2]), tonumber(meta[3]), tonumber(meta[8])
local q = Q[tag]
local max_events, sweep_threshold, split, max_age, ttl, tomb_ttl, tombstone =
  string.match(arg(2), '^(%d+),(%d+),(%d+),(%d+),(%d+),(%d+),(.*)$')
max_events, sweep_threshold = tonumber(max_events), tonumber(sweep_threshold)
split, max_age, ttl, tomb_ttl = tonumber(split), tonumber(max_age), tonumber(ttl), tonumber(tomb_ttl)
local now = now_ms() -- every event's stamp
local new_list = not s
-- The newest run (meta 'lr') goes on while this sequence holds the session's
-- newest event (then the run is this sequence's and its ordinals line up),
-- unless it is older than the split time; otherwise a new run starts.
local run_tag, run_at = nil, nil
if meta[9] and s and s.hw == top and s.first < s.next then
  run_tag = tag
  if split > 0 then run_at = tonumber(string.match(meta[9], ',(%d+)$')) or 0 end
end
local want = 0 -- the list's length once this batch is in
if s then want = s.next - s.base end
local ids, batch = {}, {}
local pushed = nil
for j = at, #AV do
  local priming = kinds ~= '' and string.byte(kinds, j - at + 1) == 112 -- 'p'
  if s and priming and s.priming == 1 and s.first < s.next then
    -- only the newest of consecutive priming events is kept: hand out its id again
    ids[#ids + 1] = s.hw .. '.' .. (s.next - 1) .. '.' .. s.stamp
  else
    top = top + 1
    if not s then
      redis.call('DEL', q) -- leftovers of an earlier sequence of this name
      s = {hw = top, stamp = now, floor = top, first = 0, next = 0, base = 0, priming = 0,
           name = name}
      nseq = nseq + 1
    elseif s.first == s.next then
      -- every event of it was evicted: it goes on where it stopped
      redis.call('ZREM', X, tag)
      s.floor = top
      nseq = nseq + 1
    end
    if run_tag ~= tag or (split > 0 and now - run_at >= split) then
      run_tag, run_at = tag, now
      pushed = top .. ',' .. tag .. ',' .. s.next .. ',' .. now
      if redis.call('RPUSH', I, pushed) == 1 then adopt(I) end
    end
    if priming then
      batch[#batch + 1] = top .. ',' .. now
      s.priming = 1
    else
      batch[#batch + 1] = top .. ',' .. now .. ':' .. AV[j]
      s.priming = 0
    end
    if #batch == 1000 then redis.call('RPUSH', q, unpack(batch)) batch = {} end
    ids[#ids + 1] = top .. '.' .. s.next .. '.' .. now
    s.next = s.next + 1
    want = want + 1
    s.hw = top
    s.stamp = now
    count = count + 1
  end
end
if #batch > 0 then
  hold_places(q, redis.call('RPUSH', q, unpack(batch)), want)
end
local _, floor, count, nseq, dirtied, lost, head_at =
  evict(max_events, max_age, now, top, meta[7], count, nseq, tag, s)
if lost then
  -- Retention cannot be kept (the session would grow without bound, or evict
  -- the wrong events): fail closed, as a failed resume does.
  local out = bury(tombstone, tomb_ttl)
  table.insert(out, 1, 'lost')
  table.insert(out, 1, epoch)
  return out
end
local fields = {'top', top, 'floor', floor, 'count', count, 'nseq', nseq}
if s.first - s.base > 64 then
  -- this sequence's own evicted head, dropped in place now and then; its
  -- newest evicted event stays (it proves a cursor at it continuous)
  redis.call('LTRIM', q, s.first - 1 - s.base, -1)
  s.base = s.first - 1
end
fields[#fields + 1] = field
fields[#fields + 1] = state_text(s)
if pushed then
  fields[#fields + 1] = 'lr'
  fields[#fields + 1] = pushed
end
if head_at and tostring(head_at) ~= meta[10] then
  fields[#fields + 1] = 'ra'
  fields[#fields + 1] = head_at
end
local touch, due = refresh(ttl, now, meta[6])
if due then
  fields[#fields + 1] = 'rf'
  fields[#fields + 1] = due
end
redis.call('HSET', M, unpack(fields))
mark_dirty(dirtied)
ids = table.concat(ids, ',')
if key ~= '' then
  if redis.call('HLEN', K) >= 1000 then redis.call('RENAME', K, K2) end
  redis.call('HSET', K, key, ids)
  adopt(K)
end
if new_list then adopt(q) end
local sweep = sweep_due(sweep_threshold, tonumber(meta[4] or '0') + dirtied)
local status = 'ok'
if count >= max_events then status = 'full' end
if #sweep == 0 and #touch == 0 then return {epoch, status, ids} end
return {epoch, status, ids, sweep, touch}
