-- plain format: compare-owner-and-extend. PEXPIRE only runs on a key that
-- exists and is ours, so a late renew can never re-create an expired lock.
--
-- KEYS[1] lock key          ARGV[1] owner token     ARGV[3] TTL in milliseconds
-- KEYS[2] bookkeeping hash  ARGV[2] fencing token
--
-- Returns 1 extended, 0 gone, -1 someone else holds it.
local holder = redis.call('GET', KEYS[1])
if not holder then
  return 0
end
if holder ~= ARGV[1] or redis.call('HGET', KEYS[2], 'fence') ~= ARGV[2] then
  return -1
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
