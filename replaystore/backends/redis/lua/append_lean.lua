-- append_lean: the common append (append_common in _lib.lua) in a lean form,
-- as few keys and arguments as a call can have: every declared key and
-- argument costs Redis time to read and to hand to Lua, about as much as a
-- line of the Lua. One data event, no idempotency key; the client sends this
-- form only without max_age. Anything else due answers {epoch, 'general'} and
-- stores nothing; the client then sends append.lua.
-- KEYS: the meta hash, the run index, the sequence's list (all this path
-- touches).
-- ARGV: the sequence's state field ('s:' .. tag), its name, max_events, the
-- sweep threshold, the client's fence (see regressed in _lib.lua), the payload.
-- Returns false (no session), {epoch, 'general'}, {epoch, 'regressed'} (as append.lua)
-- or {epoch, 'ok', "pos.ordinal.stamp"}.
M, I = keys[1], keys[2] -- the shared helpers' keys
local field = argv[1]
local meta = redis.call('HMGET', M, 'epoch', 'top', 'count', 'gc', field, 'rf')
if not meta[1] then return false end -- unknown session: never resurrect one
if regressed(argv[5], meta[1], meta[2]) then return {meta[1], 'regressed'} end
return append_common(field, argv[2], argv[3], argv[4], argv[6], meta, keys[3])
  or {meta[1], 'general'}
