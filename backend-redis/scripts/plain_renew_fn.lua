-- Shared by the plain format's renew and batch renew (prepended at build
-- time): compare-owner-and-extend one lock. PEXPIRE only runs on a key that
-- exists and is ours, so a late renew can never re-create an expired lock.
--
-- lock: the lock key; book: its bookkeeping hash; holder: the owner token;
-- fence: the lease's fencing token; ttl: milliseconds.
--
-- The counter only moves up, and only when someone takes the lock: a
-- counter past our token means a later grant. One behind it is a Redlock
-- node that granted us but missed the write-back of the quorum's token
-- (redlock_raise_fence.lua): it holds our key, so it is part of our
-- majority, and the renew writes the token back there.
--
-- Returns 1 extended, 0 gone, -1 someone else holds it.
local function renew(lock, book, holder, fence, ttl)
  local stored = redis.call('GET', lock)
  if not stored then
    return 0
  end
  if stored ~= holder then
    return -1
  end
  local order = compare_counters(redis.call('HGET', book, 'fence') or '0', fence)
  if order > 0 then
    return -1
  end
  if order < 0 then
    redis.call('HSET', book, 'fence', fence)
  end
  redis.call('PEXPIRE', lock, ttl)
  return 1
end
