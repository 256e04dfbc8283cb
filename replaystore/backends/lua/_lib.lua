-- Shared helpers, prepended to every script by replaystore/backends/redis.py.
-- Key layout (all keys of one session share the hash tag {<session>}):
--   KEYS[1] m  meta hash: epoch, top, floor, count, nseq, and per sequence
--              h:<seq> (high-water), f:<seq> (floor), c:<seq> (retained count)
--   KEYS[2] e  event stream: entry id <position>-0, fields s (sequence),
--              p (previous position of the same sequence, 0 for its first),
--              t (stored at, ms), d (msgpack-packed payload, nil = priming)
--   KEYS[3] n  link hash: <position> -> next position of the same sequence
--   KEYS[4] t  tombstone string (JSON) left by a teardown or a close
local M, E, N, T = KEYS[1], KEYS[2], KEYS[3], KEYS[4]

-- tonumber that passes nil/false through (HGET answers false for a missing field).
local function num(v)
  if v then return tonumber(v) end
  return nil
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The stream entry at a position, as {seq, prev, at, data}, or nil.
local function record(pos)
  local r = redis.call('XRANGE', E, pos .. '-0', pos .. '-0')
  if #r == 0 then return nil end
  local f = r[1][2]
  return {f[2], tonumber(f[4]), tonumber(f[6]), f[8]}
end

local function expire_all(ttl_ms)
  redis.call('PEXPIRE', M, ttl_ms)
  redis.call('PEXPIRE', E, ttl_ms)
  redis.call('PEXPIRE', N, ttl_ms)
end

-- Evict oldest entries while over max_events, or older than max_age_ms (0 = no
-- age limit). Keeps floor, count and the per-sequence bookkeeping exact.
local function trim(max_events, max_age_ms, now)
  local count = tonumber(redis.call('HGET', M, 'count'))
  if count <= max_events and max_age_ms == 0 then return end -- the common case: nothing to read
  local floor = nil
  local done = false
  while count > 0 and not done do
    local want = 1
    if count > max_events then want = math.min(count - max_events, 1000) end
    local batch = redis.call('XRANGE', E, '-', '+', 'COUNT', want)
    if #batch == 0 then break end -- stream lost under live metadata: resolve reports it
    for _, entry in ipairs(batch) do
      local f = entry[2]
      local at = tonumber(f[6])
      if count > max_events or (max_age_ms > 0 and at <= now - max_age_ms) then
        local pos = tonumber(string.match(entry[1], '^(%d+)'))
        local seq = f[2]
        local nxt = redis.call('HGET', N, pos)
        if nxt then redis.call('HDEL', N, pos) end
        local left = redis.call('HINCRBY', M, 'c:' .. seq, -1)
        if left <= 0 then
          redis.call('HDEL', M, 'h:' .. seq, 'f:' .. seq, 'c:' .. seq)
          redis.call('HINCRBY', M, 'nseq', -1)
        elseif nxt then
          redis.call('HSET', M, 'f:' .. seq, nxt)
        end
        count = count - 1
        floor = pos + 1
      else
        done = true
        break
      end
    end
    -- Trim per batch: the next XRANGE must not see this batch again.
    if floor then redis.call('XTRIM', E, 'MINID', floor .. '-0') end
  end
  if floor then redis.call('HSET', M, 'floor', floor, 'count', count) end
end

-- The session's bookkeeping as a flat array: epoch, top, floor, count, then
-- seq, floor, high-water, retained for each sequence.
local function info()
  local all = redis.call('HGETALL', M)
  local meta, seqs = {}, {}
  for i = 1, #all, 2 do
    local k, v = all[i], all[i + 1]
    local kind, name = string.match(k, '^([hfc]):(.*)$')
    if kind then
      seqs[name] = seqs[name] or {}
      seqs[name][kind] = v
    else
      meta[k] = v
    end
  end
  local out = {meta.epoch, meta.top, meta.floor, meta.count}
  for name, s in pairs(seqs) do
    table.insert(out, name); table.insert(out, s.f); table.insert(out, s.h); table.insert(out, s.c)
  end
  return out
end
