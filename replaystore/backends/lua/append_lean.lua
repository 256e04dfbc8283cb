-- append_lean: the common append in a lean form, as few arguments as a call
-- can have. One data event, no idempotency key, of a sequence that holds
-- retained events, with nothing to evict, no sweep and no TTL refresh due
-- (and no run split by age: the client sends this form only without
-- max_age). Anything else answers {epoch, 'general'} and stores nothing; the
-- client then sends append.lua, whose general path reaches the same result.
-- KEYS: the meta hash, the run index, the sequence's list (only what this
-- path touches: every declared key and argument costs Redis time to read and
-- to hand to Lua, about as much as a line of the Lua below).
-- ARGV: the sequence's state field ('s:' .. tag), its name, max_events, the
-- sweep threshold, the payload.
-- Returns false (no session), {epoch, 'general'} or {epoch, 'ok', "pos.ordinal.stamp"}.
-- Runs four commands: HMGET, TIME, RPUSH, HSET, and an RPUSH of the run index
-- when it starts a run (streams written in turn, as an MCP session's are).
-- It continues the newest run when its sequence holds the session's newest
-- event (the newest run is then this sequence's), and starts one otherwise.
-- The sequence's state is rewritten from its pieces instead of being parsed
-- whole, and numbers are kept as the text they are stored as. Converting costs
-- more than anything else here but the commands: text to a number is a C
-- strtod (twice through tonumber(), once through arithmetic, so arithmetic it
-- is), a number to text a C sprintf ('%.14g' through tostring() or `..`, about
-- twice the cost of string.format's '%d'), so only the three new numbers are
-- formatted, once each, with '%d' (positions stay below 10^14).
M, I = keys[1], keys[2] -- the shared helpers' keys (adopt)
local field = argv[1]
local meta = redis.call('HMGET', M, 'epoch', 'top', 'count', 'gc', field, 'rf')
if not meta[1] then return false end -- unknown session: never resurrect one
local name = argv[2]
local hw, kept, first, nxt, base, seq_name =
  string.match(meta[5] or '', '^(%d+),%d+,(%d+,(%d+)),(%d+),(%d+),%d,(.*)$')
if not (meta[6] and seq_name == name and first ~= nxt and meta[3] + 0 < argv[3] + 0
        and (meta[4] or 0) + 0 < argv[4] + 0) then
  return {meta[1], 'general'}
end
local t = redis.call('TIME')
local now = t[1] .. string.sub('00000' .. t[2], -6, -4)
if now + 0 >= meta[6] + 0 then return {meta[1], 'general'} end -- TTL refresh due
local fmt = string.format
local top = fmt('%d', meta[2] + 1)
local state = top .. ',' .. now .. ',' .. kept .. ',' .. fmt('%d', nxt + 1) .. ','
  .. base .. ',0,' .. name
local q = keys[3]
local run = nil
if hw ~= meta[2] then
  run = top .. ',' .. string.sub(field, 3) .. ',' .. nxt .. ',' .. now
  if redis.call('RPUSH', I, run) == 1 then adopt(I) end
end
local len = redis.call('RPUSH', q, top .. ',' .. now .. ':' .. argv[5])
local want = nxt - base + 1
if len ~= want then hold_places(q, len, want) end
if run then
  redis.call('HSET', M, 'top', top, 'count', fmt('%d', meta[3] + 1), field, state, 'lr', run)
else
  redis.call('HSET', M, 'top', top, 'count', fmt('%d', meta[3] + 1), field, state)
end
return {meta[1], 'ok', top .. '.' .. nxt .. '.' .. now}
