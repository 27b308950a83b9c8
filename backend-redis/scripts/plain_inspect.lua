-- plain format: one consistent snapshot of a lock.
--
-- KEYS[1] lock key, KEYS[2] bookkeeping hash.
-- Returns {holder or false, pttl, last fencing token or false, token of the
-- last polylock grant or false, that grant's holder description or false}.
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]),
        redis.call('HGET', KEYS[2], 'fence'), redis.call('HGET', KEYS[2], 'owner'),
        redis.call('HGET', KEYS[2], 'meta')}
