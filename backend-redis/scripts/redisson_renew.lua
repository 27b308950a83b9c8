-- redisson format: compare-owner-and-extend; never re-creates the hash.
--
-- KEYS[1] the lock hash    ARGV[1] holder field     ARGV[3] TTL in milliseconds
-- KEYS[2] fencing counter  ARGV[2] fencing token
--
-- Returns 1 extended, 0 not ours (gone or someone else's).
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 and redis.call('GET', KEYS[2]) == ARGV[2] then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end
return 0
