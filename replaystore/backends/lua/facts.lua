-- facts: what the rules need to judge a cursor, read in one atomic step (the
-- decision is made by the client, in replaystore/_rules.py).
-- ARGV: has_cursor, position, hint_tag ('' for none), hint_ordinal, named_tag
--       ('' for none), replay, max_events, max_age_ms, session_ttl_ms, sweep_threshold
-- Reply: an array whose slots are named by SLOT; the chain's elements follow.
local out = {}
for j = 1, SLOT._n do out[j] = false end
if redis.call('EXISTS', M) == 0 then
  out[SLOT.status] = 'gone'
  out[SLOT.tombstone] = redis.call('GET', T) or false
  return out
end
local has_cursor, p = arg(1) == '1', tonumber(arg(2))
local hint_tag, hint_ord, named_tag = arg(3), tonumber(arg(4)), arg(5)
local replay = arg(6) == '1'
trim(tonumber(arg(7)), tonumber(arg(8)), now_ms())
local meta = redis.call('HMGET', M, 'epoch', 'top', 'floor', 'count', 'nseq')
local top, floor, nseq = tonumber(meta[2]), tonumber(meta[3]), tonumber(meta[5])
out[SLOT.status] = 'ok'
out[SLOT.epoch], out[SLOT.top], out[SLOT.floor] = meta[1], meta[2], meta[3]
out[SLOT.count], out[SLOT.nseq] = meta[4], meta[5]
if named_tag ~= '' then out[SLOT.named_state] = redis.call('HGET', M, 's:' .. named_tag) or false end

local function need(tag)
  out[SLOT.status] = 'need'
  out[SLOT.need_tag] = tag
  return out
end

-- The sequence whose events follow: the cursor's, or for the origin the named
-- or only one.
local chain_tag, chain_from = nil, nil
if has_cursor and p >= 1 and p >= floor and p <= top then
  local tag, ord, el = nil, nil, nil
  if hint_tag ~= '' and Q[hint_tag] then
    local s = load(hint_tag)
    if s and hint_ord >= s.base then
      local cand = redis.call('LINDEX', Q[hint_tag], hint_ord - s.base)
      if element_position(cand) == p then tag, ord, el = hint_tag, hint_ord, cand end
    end
  end
  if not tag then
    -- the run holding p: the last run that starts at or before it
    local lo, hi, found = 0, redis.call('LLEN', I) - 1, nil
    while lo <= hi do
      local mid = math.floor((lo + hi) / 2)
      local run = run_of(redis.call('LINDEX', I, mid))
      if run.pos <= p then found = run lo = mid + 1 else hi = mid - 1 end
    end
    if found then
      if not Q[found.tag] then return need(found.tag) end
      local s = load(found.tag)
      if s then
        ord = found.ord + p - found.pos
        local cand = redis.call('LINDEX', Q[found.tag], ord - s.base)
        if element_position(cand) == p then tag, el = found.tag, cand end
      end
    end
  end
  if tag then
    out[SLOT.record_tag], out[SLOT.record_ordinal], out[SLOT.record_element] = tag, ord, el
    chain_tag, chain_from = tag, ord + 1
  end
elseif has_cursor and p >= 1 and p < floor then
  -- The cursor's event is evicted. It resumes only if it is the newest evicted
  -- event of its sequence (the named one, else the hinted one): the state of
  -- an emptied sequence names it (high-water and stamp), otherwise it is the
  -- element kept just before the first retained one. The client checks the
  -- stamp and decides.
  local tag = named_tag
  if tag == '' then tag = hint_tag end
  local s = tag ~= '' and load(tag)
  if s then
    if s.first >= s.next then
      if s.hw == p then chain_tag = tag end
    elseif s.first > s.base then
      if not Q[tag] then return need(tag) end
      local el = redis.call('LINDEX', Q[tag], s.first - 1 - s.base)
      if element_position(el) == p then
        out[SLOT.evicted_element] = el
        chain_tag = tag
      end
    end
  end
elseif has_cursor and p == 0 and floor <= 1 then
  if named_tag ~= '' then
    chain_tag = named_tag
  elseif nseq == 1 then
    local tags = all_tags()
    chain_tag = tags[1]
  end
end
if chain_tag then
  local s = load(chain_tag)
  if s then
    if not Q[chain_tag] then return need(chain_tag) end
    out[SLOT.chain_tag] = chain_tag
    out[SLOT.chain_state] = state_text(s)
    chain_from = chain_from or s.first
    out[SLOT.chain_ordinal] = chain_from
    local els = redis.call('LRANGE', Q[chain_tag], math.max(0, chain_from - s.base), -1)
    for _, el in ipairs(els) do
      if replay then
        table.insert(out, el)
      else
        -- a probe needs the positions only
        table.insert(out, string.match(el, '^[%d,]*:?'))
      end
    end
  end
end
if replay then out[SLOT.touch] = refresh(tonumber(arg(9))) else out[SLOT.touch] = {} end
out[SLOT.sweep] = sweep_due(tonumber(arg(10)))
return out
