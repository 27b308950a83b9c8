-- Shared by the plain format's renew and batch renew (prepended at build
-- time): compare-owner-and-extend one lock. PEXPIRE only runs on a key that
-- exists and is ours, so a late renew can never re-create an expired lock.
--
-- lock: the lock key; book: its bookkeeping hash; holder: the owner token;
-- fence: the lease's fencing token; ttl: milliseconds.
--
-- Returns 1 extended, 0 gone, -1 someone else holds it.
local function renew(lock, book, holder, fence, ttl)
  local stored = redis.call('GET', lock)
  if not stored then
    return 0
  end
  if stored ~= holder or redis.call('HGET', book, 'fence') ~= fence then
    return -1
  end
  redis.call('PEXPIRE', lock, ttl)
  return 1
end
