-- redisson format: one consistent snapshot of a lock.
--
-- KEYS[1] the lock hash, KEYS[2] fencing counter, KEYS[3] polylock's
-- bookkeeping hash.
-- Returns {{field, count, ...}, pttl, last fencing token or false, field of
-- the last polylock grant or false, its holder description or false}.
return {redis.call('HGETALL', KEYS[1]), redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]),
        redis.call('HGET', KEYS[3], 'owner'), redis.call('HGET', KEYS[3], 'meta')}
