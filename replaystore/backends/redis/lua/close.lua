-- close_session and teardown: delete the session and leave a tombstone.
-- ARGV: tombstone_json_prefix, tombstone_ttl_ms, nonce, expect_epoch, condition, value
-- With expect_epoch set, only the incarnation the verdict was decided on is torn
-- down, and only while the condition that decided it still holds (still_holds).
-- The declared lists are deleted here; the others' tags are returned.
-- Returns {1, tag...} (done; the tags' lists go next) or {0}: see tear_down.
return tear_down(arg(3), arg(4), arg(5), arg(6), arg(1), arg(2))
