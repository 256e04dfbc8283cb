-- touch: give every declared list the meta hash's TTL (after a lazy refresh).
if redis.call('EXISTS', M) == 0 then return 0 end
local left = redis.call('PTTL', M)
for _, q in pairs(Q) do
  if left > 0 then redis.call('PEXPIRE', q, left) end
end
return 1
