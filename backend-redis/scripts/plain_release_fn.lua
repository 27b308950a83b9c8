-- Shared by the plain and the fair release scripts (prepended at build
-- time): compare-owner-and-delete, then `wake()` the waiters.
--
-- KEYS[1] lock key              ARGV[1] owner token     ARGV[3] release channel
-- KEYS[2] bookkeeping hash      ARGV[2] fencing token
--
-- The counter only moves up, and only when someone takes the lock, so it
-- is past our token once anyone was granted it after us: an earlier lease
-- of the same owner (same token, lower fence) cannot delete a later one.
-- A counter behind our token is a Redlock node that missed the write-back
-- of the quorum's token; what it holds is judged by the owner alone.
--
-- `attempt`, when given (not nil or ''), releases only a grant that
-- attempt made (the bookkeeping hash's `attempt`, plain_grant.lua): the
-- undo of a cancelled retry, whose owner token may also be another
-- acquisition's.
--
-- Returns 1 released, 0 nothing to release (it expired or was removed, and
-- nobody was granted it since), -1 lost: someone else holds it (left
-- untouched) or was granted it after us (the counter moved on).
local function release(wake, attempt)
  local holder = redis.call('GET', KEYS[1])
  if compare_counters(redis.call('HGET', KEYS[2], 'fence') or '0', ARGV[2]) > 0 then
    return -1
  end
  if not holder then
    return 0
  end
  if holder ~= ARGV[1] then
    return -1
  end
  if attempt and attempt ~= '' and redis.call('HGET', KEYS[2], 'attempt') ~= attempt then
    return -1
  end
  redis.call('DEL', KEYS[1])
  redis.call('HDEL', KEYS[2], 'meta')
  wake()
  return 1
end
