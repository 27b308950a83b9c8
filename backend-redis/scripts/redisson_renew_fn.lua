-- Shared by the redisson format's renew and batch renew (prepended at build
-- time): compare-owner-and-extend one lock hash; never re-creates it.
--
-- lock: the lock hash; counter: the fencing counter; holder: the holder
-- field UUID:THREAD; fence: the lease's fencing token; ttl: milliseconds.
--
-- The holds of one field share the hash's expiry, each lease with a
-- deadline of its own: the expiry is only ever extended, so a lease with a
-- short TTL never cuts off another hold whose lease runs longer.
--
-- Returns 1 extended (or already long enough), 0 not ours (gone or someone
-- else's).
local function renew(lock, counter, holder, fence, ttl)
  if redis.call('HEXISTS', lock, holder) == 1 and redis.call('GET', counter) == fence then
    extend(lock, ttl)
    return 1
  end
  return 0
end
