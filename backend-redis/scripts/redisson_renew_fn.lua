-- Shared by the redisson format's renew and batch renew (prepended at build
-- time): compare-owner-and-extend one lock hash; never re-creates it.
--
-- lock: the lock hash; counter: the fencing counter; holder: the holder
-- field UUID:THREAD; fence: the lease's fencing token; ttl: milliseconds.
--
-- Returns 1 extended, 0 not ours (gone or someone else's).
local function renew(lock, counter, holder, fence, ttl)
  if redis.call('HEXISTS', lock, holder) == 1 and redis.call('GET', counter) == fence then
    redis.call('PEXPIRE', lock, ttl)
    return 1
  end
  return 0
end
