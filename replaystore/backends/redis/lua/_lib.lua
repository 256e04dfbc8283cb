-- Shared helpers, loaded before the operations by replaystore/backends/redis/scripts.py
-- (after a generated `local SLOT = {...}` table naming the reply slots).
-- Every key a script touches is declared in KEYS, all with the session's hash tag:
--   KEYS[1] m  meta hash: epoch, top, floor, count, nseq, gc, lr (newest run),
--              rf (when the TTL refresh falls due, ms), and per sequence
--              s:<tag> = "high_water,stamp,floor,first,next,base,priming,name"
--   KEYS[2] i  run index list: "<position>,<tag>,<ordinal>,<ms>" per stretch of
--              consecutive positions of one sequence, oldest first
--   KEYS[3] g  set of sequence tags whose list holds evicted elements
--   KEYS[4] t  tombstone string (JSON) left by a teardown or a close
--   KEYS[5] k, KEYS[6] k2  idempotency keys: this generation, the previous one
--   KEYS[7] x  sorted set of the tags of emptied sequences (every event evicted,
--              state kept), scored by their high-water; at most EVICTED_SEQUENCES
--   KEYS[8..] q:<tag>  one list per sequence, the tags listed in ARGV[2..1+ARGV[1]]:
--              element "<position>,<stamp>:<payload>", or "<position>,<stamp>" for a
--              priming event; <stamp> is the server clock (ms) when it was stored
-- ARGV: the number of lists, their tags, then the operation's own arguments
-- (read with arg(n)).
-- The same code runs as a function library (FCALL: defined once, called by
-- name) or as one EVAL script per operation; `run` sets these per call.
local KS, AV
local M, I, G, T, K, K2, X
local Q = {}
local A = 1 -- script arguments start at AV[A + 1]

local function setup(keys, argv)
  KS, AV = keys, argv
  M, I, G, T, K, K2, X = keys[1], keys[2], keys[3], keys[4], keys[5], keys[6], keys[7]
  local nq = argv[1] + 0 -- arithmetic converts once, tonumber() twice
  Q = {}
  for j = 1, nq do Q[argv[1 + j]] = keys[7 + j] end
  A = 1 + nq
end

local function run(op, keys, argv)
  setup(keys, argv)
  return op()
end

local function arg(n) return AV[A + n] end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- now_ms() as the text it is stored as, where no arithmetic follows: a number
-- turned into text costs a C sprintf in Lua.
local function now_text()
  local t = redis.call('TIME')
  return t[1] .. string.sub('00000' .. t[2], -6, -4)
end

-- Whether the session went back behind a position this client was handed:
-- fence is '' or the epoch (12 hex digits) and that position, as one text.
-- Within one incarnation the high-water only rises, so a high-water below a
-- position handed out means the store lost acknowledged appends (a failover
-- to a replica that had not received them) and issues those positions again.
local function regressed(fence, epoch, top)
  return fence ~= '' and string.sub(fence, 1, 12) == epoch
    and string.sub(fence, 13) + 0 > top + 0
end

local function parse_state(raw)
  if not raw then return nil end
  local hw, hs, fl, first, nxt, base, prim, name =
    string.match(raw, '^(%d+),(%d+),(%d+),(%d+),(%d+),(%d+),(%d),(.*)$')
  return {hw = tonumber(hw), stamp = hs, floor = tonumber(fl), first = tonumber(first),
          next = tonumber(nxt), base = tonumber(base), priming = tonumber(prim), name = name}
end

-- The name in a sequence's state (nil for none), without parsing the numbers.
local function state_name(raw)
  return raw and string.match(raw, '^%d+,%d+,%d+,%d+,%d+,%d+,%d,(.*)$')
end

local function load(tag) return parse_state(redis.call('HGET', M, 's:' .. tag)) end

local function state_text(s)
  return s.hw .. ',' .. s.stamp .. ',' .. s.floor .. ',' .. s.first .. ',' .. s.next .. ','
    .. s.base .. ',' .. s.priming .. ',' .. s.name
end

local function save(tag, s) redis.call('HSET', M, 's:' .. tag, state_text(s)) end

local function run_of(raw)
  if not raw then return nil end
  local pos, tag, ord, at = string.match(raw, '^(%d+),(%x+),(%d+),(%d+)$')
  return {pos = tonumber(pos), tag = tag, ord = tonumber(ord), at = tonumber(at)}
end

-- A key created by this call takes the meta hash's remaining TTL, so that every
-- key of the session expires together.
local function adopt(key)
  if redis.call('PTTL', key) == -1 then
    local left = redis.call('PTTL', M)
    if left > 0 then redis.call('PEXPIRE', key, left) end
  end
end

-- Every event of the sequence `tag` (state `s`) is evicted. Its state stays
-- (floor one past its high-water), because the high-water and its stamp prove
-- that a client holding that newest event missed nothing; the newest
-- EVICTED_SEQUENCES of these are kept, an older one is forgotten (its list
-- goes with the next sweep) and resumes from it fail closed.
local function emptied(tag, s)
  s.floor = s.hw + 1
  if redis.call('ZADD', X, s.hw, tag) == 1 and redis.call('ZCARD', X) > EVICTED_SEQUENCES then
    local old = redis.call('ZPOPMIN', X)[1]
    redis.call('HDEL', M, 's:' .. old)
    redis.call('SADD', G, old)
    adopt(G)
  end
  adopt(X)
end

local function element_position(el)
  if not el or el == '' then return nil end
  return tonumber(string.match(el, '^(%d+)'))
end

-- After an RPUSH to list q returned len where want elements were due: if the
-- list was lost under live bookkeeping, hold the lost events' places, so that
-- the new events sit at their ordinals (the lost ones read as missing).
local function hold_places(q, len, want)
  local lost = want - len
  while lost > 0 do
    local blanks = {}
    for j = 1, math.min(lost, 1000) do blanks[j] = '' end
    redis.call('LPUSH', q, unpack(blanks))
    lost = lost - #blanks
  end
end

-- The common append: one data event (`payload`) of the sequence whose state
-- field is `field` (list `q`), named `name`, that holds retained events, with
-- nothing to evict (count below `cap`), no sweep (gc below `sweep_at`) and no
-- TTL refresh due, and no run split by age (the callers take it only without
-- max_age). `meta` is the HMGET of 'epoch', 'top', 'count', 'gc', field, 'rf'
-- (first six slots). Returns the reply, or nil with nothing written when
-- anything else is due (the general path of append.lua then does it all).
-- Four commands: TIME, RPUSH, HSET, and an RPUSH of the run index when it
-- starts a run (streams written in turn, as an MCP session's are). It
-- continues the newest run when its sequence holds the session's newest event
-- (the newest run is then this sequence's), and starts one otherwise. The
-- sequence's state is rewritten from its pieces instead of being parsed
-- whole, and numbers are kept as the text they are stored as. Converting
-- costs more than anything else here but the commands: text to a number is a
-- C strtod (twice through tonumber(), once through arithmetic, so arithmetic
-- it is), a number to text a C sprintf ('%.14g' through tostring() or `..`,
-- about twice the cost of string.format's '%d'), so only the three new
-- numbers are formatted, once each, with '%d' (positions stay below 10^14).
local function append_common(field, name, cap, sweep_at, payload, meta, q)
  local hw, kept, first, nxt, base, seq_name =
    string.match(meta[5] or '', '^(%d+),%d+,(%d+,(%d+)),(%d+),(%d+),%d,(.*)$')
  if not (meta[6] and seq_name == name and first ~= nxt and meta[3] + 0 < cap + 0
          and (meta[4] or 0) + 0 < sweep_at + 0) then
    return nil
  end
  local t = redis.call('TIME')
  local now = t[1] .. string.sub('00000' .. t[2], -6, -4)
  if now + 0 >= meta[6] + 0 then return nil end -- TTL refresh due
  local fmt = string.format
  local top = fmt('%d', meta[2] + 1)
  local state = top .. ',' .. now .. ',' .. kept .. ',' .. fmt('%d', nxt + 1) .. ','
    .. base .. ',0,' .. name
  local run = nil
  if hw ~= meta[2] then
    run = top .. ',' .. string.sub(field, 3) .. ',' .. nxt .. ',' .. now
    if redis.call('RPUSH', I, run) == 1 then adopt(I) end
  end
  local len = redis.call('RPUSH', q, top .. ',' .. now .. ':' .. payload)
  local want = nxt - base + 1
  if len ~= want then hold_places(q, len, want) end
  if run then
    redis.call('HSET', M, 'top', top, 'count', fmt('%d', meta[3] + 1), field, state, 'lr', run)
  else
    redis.call('HSET', M, 'top', top, 'count', fmt('%d', meta[3] + 1), field, state)
  end
  return {meta[1], 'ok', top .. '.' .. nxt .. '.' .. now}
end

-- Evict the oldest events while over max_events, or older than max_age_ms (an
-- event is as old as its run). Only bookkeeping changes here: the evicted
-- elements stay in their lists (a list not declared in KEYS must not be
-- touched) and their tags go to G, until a sweep with those lists declared
-- removes them. The sequence `own` (tag `own_tag`, state in hand, list
-- declared) is updated in place and not marked: its caller saves it.
-- Returns evicted, floor, count, nseq, how many evicted events went to G,
-- lost, and the start (ms) of the oldest run read (with an age limit; never
-- later than the oldest run's real start, which only moves forward): kept in
-- the meta field 'ra' so that a resume can tell from the meta hash alone that
-- no age eviction is due. lost is true when the session is over max_events but the index cannot place
-- the oldest events (the index, or its oldest runs, were lost: it no longer
-- starts at the floor), so nothing can be evicted in order. (Age alone is not
-- enough to say lost: the events' ages went with the index, so they stay, up
-- to max_events.)
local function evict(max_events, max_age_ms, now, top, floor, count, nseq, own_tag, own)
  top, floor, count, nseq = tonumber(top), tonumber(floor), tonumber(count), tonumber(nseq)
  local evicted, dirtied, head_at = 0, 0, nil
  while count > 0 and (count > max_events or max_age_ms > 0) do
    local run = run_of(redis.call('LINDEX', I, 0))
    -- The oldest run always starts at or before the floor: if it does not
    -- (or there is none), the index lost runs and the events at the floor
    -- belong to no known sequence.
    if not run or run.pos > floor then
      return evicted, floor, count, nseq, dirtied, count > max_events, head_at
    end
    if max_age_ms > 0 then head_at = run.at end
    local after = run_of(redis.call('LINDEX', I, 1))
    local stop = top + 1
    if after then stop = after.pos end
    local avail = stop - floor
    if avail <= 0 then
      redis.call('LPOP', I)
    else
      local k = 0
      if count > max_events then k = math.min(count - max_events, avail) end
      if max_age_ms > 0 and run.at <= now - max_age_ms then k = avail end
      if k == 0 then break end
      local mine = run.tag == own_tag
      local s = own
      if not mine then s = load(run.tag) end
      floor = floor + k
      count = count - k
      evicted = evicted + k
      if s then
        s.first = s.first + k
        if s.first >= s.next then
          nseq = nseq - 1
          emptied(run.tag, s)
          if not mine then save(run.tag, s) end
        else
          if floor < stop then
            s.floor = floor
          else
            -- the sequence goes on in a later run: find it
            local n = redis.call('LLEN', I)
            for j = 1, n - 1 do
              local later = run_of(redis.call('LINDEX', I, j))
              if later.tag == run.tag then s.floor = later.pos break end
            end
          end
          if not mine then save(run.tag, s) end
        end
        if not mine then
          redis.call('SADD', G, run.tag)
          dirtied = dirtied + k
        end
      end
      if floor >= stop then redis.call('LPOP', I) end
    end
  end
  return evicted, floor, count, nseq, dirtied, false, head_at
end

local function mark_dirty(dirtied)
  if dirtied > 0 then
    redis.call('HINCRBY', M, 'gc', dirtied)
    adopt(G)
  end
end

-- evict() for a caller with no sequence of its own, bookkeeping saved. `meta`
-- is {top, floor, count, nseq, ra} when the caller has read them already.
-- Returns the floor, count and nseq after it.
local function trim(max_events, max_age_ms, now, meta)
  meta = meta or redis.call('HMGET', M, 'top', 'floor', 'count', 'nseq', 'ra')
  local evicted, floor, count, nseq, dirtied, _, head_at =
    evict(max_events, max_age_ms, now, meta[1], meta[2], meta[3], meta[4])
  if evicted > 0 then
    redis.call('HSET', M, 'floor', floor, 'count', count, 'nseq', nseq)
    mark_dirty(dirtied)
  end
  if head_at and tostring(head_at) ~= meta[5] then redis.call('HSET', M, 'ra', head_at) end
  return floor, count, nseq
end

-- Tags of every sequence of the session (for a refresh or a teardown).
local function all_tags()
  local fields = redis.call('HKEYS', M)
  local out = {}
  for _, f in ipairs(fields) do
    local tag = string.match(f, '^s:(%x+)$')
    if tag then table.insert(out, tag) end
  end
  return out
end

-- Delete the session and leave the tombstone `tomb` (JSON without its time and
-- closing brace) for ttl_ms. The declared lists go with it; returns the tags
-- of the others (each once), which the client sweeps next. `now` when the
-- caller has it.
local function bury(tomb, ttl_ms, now)
  local out, seen = {}, {}
  for _, tag in ipairs(all_tags()) do
    if not Q[tag] then out[#out + 1] = tag seen[tag] = true end
  end
  for _, tag in ipairs(redis.call('SMEMBERS', G)) do
    if not Q[tag] and not seen[tag] then out[#out + 1] = tag end
  end
  local keys = {M, I, G, K, K2, X}
  for _, q in pairs(Q) do keys[#keys + 1] = q end
  redis.call('DEL', unpack(keys)) -- one command: each redis.call costs more than a key
  redis.call('SET', T, tomb .. ',"at":' .. (now or now_text()) .. '}', 'PX', ttl_ms)
  return out
end

-- Whether a failed verdict still holds, so that its teardown may go ahead.
-- `meta` is the HMGET of 'epoch', 'top', 'floor', 'nseq' and 's:' .. value.
-- The session must still be the incarnation `epoch` the verdict was decided
-- on ('' for any: a close), and the condition `cond` it was decided under
-- (teardown.py's still_true) must still hold for `value`:
--   'always'        nothing further (malformed, foreign, below the floor)
--   'top_below'     the high-water is still below value (ahead_of_high_water)
--   'no_sequence'   there is still no sequence with tag value (unknown_sequence)
--   'ambiguous'     nothing evicted yet and more than one sequence
--   'floor_at_most' the floor has not passed value (verdicts read from an event)
-- Appends and evictions go on while a resume is judged: a verdict they changed
-- is judged again rather than torn down. teardown.py's transaction checks the
-- same on the meta hash in Python (still_holds there); one table of cases
-- holds both.
local function still_holds(meta, epoch, cond, value)
  if epoch ~= '' and meta[1] ~= epoch then return false end
  if cond == 'top_below' then return tonumber(meta[2]) < tonumber(value) end
  if cond == 'no_sequence' then return not meta[5] end
  if cond == 'ambiguous' then return tonumber(meta[3]) <= 1 and tonumber(meta[4]) > 1 end
  if cond == 'floor_at_most' then return tonumber(meta[3]) <= tonumber(value) end
  return true
end

-- Tear the session down while still_holds(epoch, cond, value), and leave the
-- tombstone `tomb` (its JSON head) naming `nonce` for ttl_ms; `now` as bury's.
-- The nonce makes a retry of a call that already ran answer the same: a
-- session found gone answers {1} when its tombstone names `nonce`.
-- Returns {1, tag...} (done; the other lists' tags, for the client to delete
-- next) or {0} (gone, or the verdict no longer holds).
local function tear_down(nonce, epoch, cond, value, tomb, ttl_ms, now)
  local meta = redis.call('HMGET', M, 'epoch', 'top', 'floor', 'nseq', 's:' .. value)
  if not meta[1] then
    local t = redis.call('GET', T)
    if t and string.find(t, '"id":"' .. nonce .. '"', 1, true) then return {1} end
    return {0}
  end
  if not still_holds(meta, epoch, cond, value) then return {0} end
  local out = bury(tomb .. ',"id":"' .. nonce .. '"', ttl_ms, now)
  table.insert(out, 1, 1)
  return out
end

-- TTLs are refreshed lazily: only when the meta hash has used up a tenth of
-- its TTL, and then on every key of the session (the lists not declared here
-- are refreshed by the touch script the client sends next, with these tags).
-- A caller that knows the time (`now`) and the meta field 'rf' (`due`: the
-- moment the refresh falls due, as far as known) skips the PTTL while `now` is
-- before it, and gets back a new 'rf' to store. 'rf' is never later than the
-- real due time: every PEXPIRE of the meta hash extends it. `early` (ms)
-- refreshes that much ahead of time: a resume calls the script within
-- CLOCK_MARGIN_MS of 'rf' (the clocks may differ), and refreshing then gets the
-- following resumes back on the fast path.
local function refresh(ttl_ms, now, due, early)
  early = early or 0
  if now and due and now + early < tonumber(due) then return {}, nil end
  local keep = math.floor(ttl_ms * 0.9)
  local left = redis.call('PTTL', M)
  if left >= 0 and left >= keep + early then return {}, now and now + left - keep end
  for _, key in ipairs({M, I, G, K, K2, X}) do redis.call('PEXPIRE', key, ttl_ms) end
  for _, key in pairs(Q) do redis.call('PEXPIRE', key, ttl_ms) end
  return all_tags(), now and now + ttl_ms - keep
end

-- The dirty tags, when enough evicted elements wait in lists for a sweep.
local function sweep_due(threshold, gc)
  gc = gc or tonumber(redis.call('HGET', M, 'gc') or '0')
  if gc < threshold then return {} end
  return redis.call('SMEMBERS', G)
end
