-- Shared by the plain and the fair release scripts (prepended at build
-- time): compare-owner-and-delete, then `wake()` the waiters.
--
-- KEYS[1] lock key              ARGV[1] owner token     ARGV[3] release channel
-- KEYS[2] bookkeeping hash      ARGV[2] fencing token
--
-- The counter only moves when someone takes the lock, so it still equals
-- our token exactly while our holding lasts: an earlier lease of the same
-- owner (same token, lower fence) cannot delete a later one.
--
-- Returns 1 released, 0 nothing to release (it expired or was removed, and
-- nobody was granted it since), -1 lost: someone else holds it (left
-- untouched) or was granted it after us (the counter moved on).
local function release(wake)
  local holder = redis.call('GET', KEYS[1])
  local fence = redis.call('HGET', KEYS[2], 'fence')
  if fence ~= ARGV[2] then
    return -1
  end
  if not holder then
    return 0
  end
  if holder ~= ARGV[1] then
    return -1
  end
  redis.call('DEL', KEYS[1])
  redis.call('HDEL', KEYS[2], 'meta')
  wake()
  return 1
end
