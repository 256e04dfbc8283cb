-- facts: what the rules need to judge a cursor, read in one atomic step (the
-- decision is made by the client, in replaystore/rules.py).
-- ARGV: has_cursor, position, hint_tag ('' for none), hint_ordinal, named_tag
--       ('' for none), replay, max_events, max_age_ms, session_ttl_ms, sweep_threshold,
--       cursor_epoch, cursor_stamp ('' for none), named_name, teardown
-- teardown is '' (never tear down here) or "tombstone_ttl_ms,nonce": when one
-- of the conditions of the generated TORN table holds (checked in
-- decided_early() and decided(), in the order of the rules), the session is
-- torn down in this same call, on exactly the state read, with the tombstone
-- of that condition's code and verdict, and the reply's status is 'torn' with
-- the code in SLOT.torn. The script names conditions on the facts, never a
-- verdict: TORN maps each condition to its code (generated from the client's
-- table), and its rules (replaystore/rules.py) must reach that code from the
-- facts returned, or the call fails (a test compares the two over generated
-- cases).
-- Anything else is left to the client, which tears down with close.lua.
-- Reply: an array whose slots are named by SLOT; the chain's elements follow.
local out = {}
for j = 1, SLOT._n do out[j] = false end
local has_cursor, p = arg(1) == '1', tonumber(arg(2))
local hint_tag, hint_ord, named_tag = arg(3), tonumber(arg(4)), arg(5)
local replay = arg(6) == '1'
local meta = redis.call('HMGET', M, 'epoch', 'top', 'floor', 'count', 'nseq', 'rf', 'ra',
                        's:' .. named_tag)
if not meta[1] then
  out[SLOT.status] = 'gone'
  out[SLOT.tombstone] = redis.call('GET', T) or false
  return out
end
local top = tonumber(meta[2])
local named_raw = nil
if named_tag ~= '' then
  named_raw = meta[8]
  out[SLOT.named_state] = named_raw or false
end
out[SLOT.status] = 'ok'
out[SLOT.epoch], out[SLOT.top] = meta[1], meta[2]
out[SLOT.floor], out[SLOT.count], out[SLOT.nseq] = meta[3], meta[4], meta[5]

-- The teardown of a failure decided here (see decided() below): the session
-- and the declared lists deleted, the tombstone left, the other lists' tags
-- returned for a sweep.
local teardown = ''
if replay then teardown = arg(14) end
local function torn(condition, now)
  local code, tomb = TORN[condition][1], TORN[condition][2]
  local ttl, nonce = string.match(teardown, '^(%d+),(%x+)$')
  if out[SLOT.record_tag] then
    -- the record's sequence names the cursor's in the evidence
    local s = load(out[SLOT.record_tag])
    if s then out[SLOT.chain_state] = state_text(s) end
  end
  out[SLOT.status] = 'torn'
  out[SLOT.torn] = code
  out[SLOT.touch] = {}
  out[SLOT.sweep] = bury(tomb .. ',"id":"' .. nonce .. '"', tonumber(ttl), now)
  return out
end

-- The conditions read from the meta hash alone, in the order of the rules
-- (replaystore/rules.py, judge), before anything else is read or evicted:
-- eviction changes none of them, and the session goes anyway.
local function decided_early()
  if not has_cursor then return 'no_cursor' end
  if arg(11) ~= meta[1] then return 'epoch_differs' end
  if named_tag ~= '' and state_name(named_raw) ~= arg(13) then
    return nil -- unknown_sequence: the client's
  end
  if p > top then return 'past_top' end
  return nil
end
if teardown ~= '' then
  local code = decided_early()
  if code then return torn(code) end
end

local now = now_ms()
local floor, count, nseq = trim(tonumber(arg(7)), tonumber(arg(8)), now,
                                {meta[2], meta[3], meta[4], meta[5], meta[7]})
out[SLOT.floor], out[SLOT.count], out[SLOT.nseq] = floor, count, nseq
if named_tag ~= '' and floor ~= tonumber(meta[3]) then
  -- eviction changed the named sequence's state, or forgot it
  named_raw = redis.call('HGET', M, 's:' .. named_tag)
  out[SLOT.named_state] = named_raw or false
end

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
-- The conditions read once the cursor's event is looked up (after eviction),
-- in the order of the rules; nil where the client must decide.
local function decided()
  if not has_cursor or arg(11) ~= meta[1] or p == 0 or p > top then return nil end
  if named_tag ~= '' and state_name(named_raw) ~= arg(13) then
    return nil -- unknown_sequence: the client's
  end
  if p < floor then
    if chain_tag then return nil end -- resumes, or a stamp to compare: the client's
    return 'below_floor_unproven'
  end
  local el = out[SLOT.record_element]
  if not el or named_tag == '' or out[SLOT.record_tag] == named_tag then return nil end
  local stamp = string.match(el, '^%d+,(%d+)')
  if arg(12) ~= '' and tonumber(stamp) ~= tonumber(arg(12)) then return nil end -- other_event
  return 'other_sequence'
end
if teardown ~= '' then
  local code = decided()
  if code then return torn(code, now) end
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
out[SLOT.touch] = {}
if replay then
  local touch, due = refresh(tonumber(arg(9)), now, meta[6], CLOCK_MARGIN_MS)
  out[SLOT.touch] = touch
  if due then redis.call('HSET', M, 'rf', due) end
end
out[SLOT.sweep] = sweep_due(tonumber(arg(10)))
return out
