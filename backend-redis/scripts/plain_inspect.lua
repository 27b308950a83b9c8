-- plain format: one consistent snapshot of a lock.
--
-- KEYS[1] lock key, KEYS[2] fencing counter.
-- Returns {holder or false, pttl, last fencing token or false}.
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2])}
