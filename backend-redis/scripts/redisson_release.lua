-- redisson format: drop one hold; delete the hash and publish Redisson's
-- unlock message when it was the last.
--
-- KEYS[1] the lock hash    ARGV[1] holder field     ARGV[3] TTL in milliseconds
-- KEYS[2] fencing counter  ARGV[2] fencing token    ARGV[4] Redisson's channel
-- KEYS[3] polylock's bookkeeping hash
--
-- Returns 1 released, 2 a hold remains (expiry refreshed to the TTL, as
-- Redisson's unlock does, but never shortened), 0 nothing
-- to release (gone, and nobody was granted it since), -1 lost: someone else
-- holds it (left untouched) or was granted it after us (the counter moved).
if redis.call('EXISTS', KEYS[1]) == 0 then
  if redis.call('GET', KEYS[2]) ~= ARGV[2] then
    return -1
  end
  return 0
end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 or redis.call('GET', KEYS[2]) ~= ARGV[2] then
  return -1
end
if redis.call('HINCRBY', KEYS[1], ARGV[1], -1) > 0 then
  extend(KEYS[1], ARGV[3])
  return 2
end
redis.call('DEL', KEYS[1])
redis.call('HDEL', KEYS[3], 'meta')
redis.call('PUBLISH', ARGV[4], '0')
return 1
