-- close_session and teardown: delete the session and leave a tombstone.
-- ARGV: tombstone_json_prefix, tombstone_ttl_ms, nonce, expect_epoch, condition, value
-- With expect_epoch set, only the incarnation the verdict was decided on is torn
-- down, and only while the condition that decided it still holds (so the
-- verdict is true at the moment of the teardown):
--   'always'        nothing further (malformed, foreign, below the floor)
--   'top_below'     the high-water is still below value (ahead_of_high_water)
--   'no_sequence'   there is still no sequence with tag value (unknown_sequence)
--   'ambiguous'     nothing evicted yet and more than one sequence
--   'floor_at_most' the floor has not passed value (verdicts read from an event)
-- The nonce makes a retry of a call that already ran answer the same.
-- The declared lists are deleted here; the others' tags are returned.
-- Returns {1, tag...} (done; the tags' lists go next) or {0}.
local meta = redis.call('HMGET', M, 'epoch', 'top', 'floor', 'nseq')
if not meta[1] then
  local t = redis.call('GET', T)
  if t and string.find(t, '"id":"' .. arg(3) .. '"', 1, true) then return {1} end
  return {0}
end
if arg(4) ~= '' then
  local cond, value = arg(5), arg(6)
  local top, floor, nseq = tonumber(meta[2]), tonumber(meta[3]), tonumber(meta[4])
  local holds = meta[1] == arg(4)
  if cond == 'top_below' then holds = holds and top < tonumber(value)
  elseif cond == 'no_sequence' then holds = holds and redis.call('HEXISTS', M, 's:' .. value) == 0
  elseif cond == 'ambiguous' then holds = holds and floor <= 1 and nseq > 1
  elseif cond == 'floor_at_most' then holds = holds and floor <= tonumber(value)
  end
  if not holds then return {0} end
end
local out = bury(arg(1) .. ',"id":"' .. arg(3) .. '"', tonumber(arg(2)))
table.insert(out, 1, 1)
return out
