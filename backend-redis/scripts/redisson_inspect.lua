-- redisson format: one consistent snapshot of a lock.
--
-- KEYS[1] the lock hash, KEYS[2] fencing counter.
-- Returns {{field, count, ...}, pttl, last fencing token or false}.
return {redis.call('HGETALL', KEYS[1]), redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2])}
