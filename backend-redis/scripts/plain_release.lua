-- plain format: compare-owner-and-delete, then wake the waiters.
--
-- KEYS[1] lock key         ARGV[1] owner token     ARGV[3] release channel
-- KEYS[2] fencing counter  ARGV[2] fencing token
--
-- The counter only moves when someone takes the lock, so it still equals
-- our token exactly while our holding lasts: an earlier lease of the same
-- owner (same token, lower fence) cannot delete a later one.
--
-- Returns 1 released, 0 nothing to release (expired or released before),
-- -1 someone else holds it (left untouched).
local holder = redis.call('GET', KEYS[1])
if not holder then
  return 0
end
if holder ~= ARGV[1] or redis.call('GET', KEYS[2]) ~= ARGV[2] then
  return -1
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[3], '0')
return 1
