-- resolve (and replay): judge a cursor and, when it resumes, return the missed
-- events; a failed verdict tears the session down in the same step.
-- The rules and their order are those of replaystore/_rules.py and docs/verdicts.md.
-- ARGV: has_cursor, cursor_epoch, cursor_position, has_named, named, replay,
--       teardown, max_events, max_age_ms, session_ttl_ms, tombstone_ttl_ms
-- Returns {verdict, code, sequence, cursor_sequence, epoch, top, floor, count,
--          nseq, seq_floor, seq_high_water, torn_down, tombstone, pos, data, ...}
local has_cursor = ARGV[1] == '1'
local c_epoch, p = ARGV[2], tonumber(ARGV[3])
local named = false
if ARGV[4] == '1' then named = ARGV[5] end
local replay, teardown = ARGV[6] == '1', ARGV[7] == '1'

if redis.call('EXISTS', M) == 0 then
  return {'unknown_session', 'no_session', false, false, false, false, false, false,
          false, false, false, 0, redis.call('GET', T) or false}
end
local now = now_ms()
trim(tonumber(ARGV[8]), tonumber(ARGV[9]), now)
local meta = redis.call('HMGET', M, 'epoch', 'top', 'floor', 'count', 'nseq')
local epoch, top, floor, count, nseq =
  meta[1], tonumber(meta[2]), tonumber(meta[3]), tonumber(meta[4]), tonumber(meta[5])

local function seq_hw(name) return num(redis.call('HGET', M, 'h:' .. name)) end

-- Follow the sequence's links from `start`; every hop must prove continuity.
local function walk(seq, start, prev)
  local chain = {}
  local pos = start
  while pos do
    local r = record(pos)
    if not r or r[2] ~= prev or r[1] ~= seq then return 'not_retained', 'chain_broken', {} end
    table.insert(chain, pos); table.insert(chain, r[4])
    prev = pos
    pos = num(redis.call('HGET', N, pos))
  end
  if prev ~= seq_hw(seq) then return 'not_retained', 'chain_short', {} end
  return 'resumed', 'resumed', chain
end

local function judge()
  if not has_cursor then return 'malformed_cursor', 'malformed', named, false, {} end
  if c_epoch ~= epoch then return 'foreign_cursor', 'foreign', named, false, {} end
  if named and not seq_hw(named) then
    return 'unknown_sequence', 'unknown_sequence', named, false, {}
  end
  if p > top then return 'ahead_of_high_water', 'ahead', named, false, {} end
  if p == 0 then
    if floor > 1 then return 'below_floor', 'origin_evicted', named, false, {} end
    local seq = named
    if not seq then
      if nseq > 1 then return 'ambiguous_sequence', 'origin_ambiguous', false, false, {} end
      if nseq == 0 then return 'resumed', 'origin_empty', false, false, {} end
      local first = redis.call('XRANGE', E, '-', '+', 'COUNT', 1)
      if #first == 0 then return 'not_retained', 'missing_event', false, false, {} end
      seq = first[1][2][2]
    end
    local start = tonumber(redis.call('HGET', M, 'f:' .. seq))
    local v, code, chain = walk(seq, start, 0)
    return v, code, seq, false, chain
  end
  if p < floor then return 'below_floor', 'evicted', named, false, {} end
  local r = record(p)
  if not r then return 'not_retained', 'missing_event', named, false, {} end
  if named and r[1] ~= named then return 'sequence_mismatch', 'mismatch', named, r[1], {} end
  local seq = r[1]
  if not seq_hw(seq) then return 'not_retained', 'no_sequence_state', seq, false, {} end
  local v, code, chain = walk(seq, num(redis.call('HGET', N, p)), p)
  return v, code, seq, false, chain
end

local verdict, code, seq, cursor_seq, chain = judge()
local s_floor, s_hw = false, false
if seq and seq_hw(seq) then
  s_floor = tonumber(redis.call('HGET', M, 'f:' .. seq))
  s_hw = seq_hw(seq)
end
local torn = 0
if verdict ~= 'resumed' and replay and teardown then
  redis.call('DEL', M, E, N)
  redis.call('SET', T, cjson.encode({code = code, verdict = verdict, at = now}),
             'PX', tonumber(ARGV[11]))
  torn = 1
elseif replay then
  expire_all(tonumber(ARGV[10]))
end
local out = {verdict, code, seq, cursor_seq, epoch, top, floor, count, nseq, s_floor, s_hw, torn, false}
if replay and verdict == 'resumed' then
  for _, v in ipairs(chain) do table.insert(out, v) end
end
return out
