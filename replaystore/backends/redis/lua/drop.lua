-- drop: delete the lists a teardown left behind, for several sessions at once.
-- KEYS: per session its meta hash, then its leftover lists. ARGV: 0 (no lists
-- of the usual kind), then per session the number of lists after its meta hash.
-- A session whose meta hash exists again was opened anew under the same id: its
-- lists are left alone (the new incarnation resets a list when it creates that
-- sequence, and an old one expires with the old session's TTL). Idempotent.
-- Returns the number of lists deleted.
local dead, k, j = {}, 1, 1
while arg(j) do
  local n = tonumber(arg(j))
  if redis.call('EXISTS', KS[k]) == 0 then
    for i = 1, n do dead[#dead + 1] = KS[k + i] end
  end
  k, j = k + 1 + n, j + 1
end
if #dead > 0 then redis.call('UNLINK', unpack(dead)) end
return #dead
