-- Shared by the fair-mode scripts (prepended at build time, after
-- fence_seed.lua and plain_grant.lua): the queue of waiters of one lock,
-- beside its bookkeeping (same hash tag, same slot).
--
-- QUEUE (a sorted set): waiter id -> arrival number (HINCRBY of the
--   bookkeeping hash's field `qseq`), so its first member is the oldest.
-- DEADLINES (a sorted set): waiter id -> server time (ms) after which the
--   entry is dead. Each attempt of a waiter pushes its deadline on, so a
--   waiter that crashed leaves the queue by itself.
-- WAITERS (a hash): waiter id -> 'TTL:SEEN:TOKEN:META', what a release
--   needs to hand the lock straight to that waiter: how long to grant it
--   for (ms; a claim window, which the waiter's first renewal extends to
--   its TTL, so that a waiter that died is granted the lock only that
--   long), the server time of its last attempt (ms), its owner token and its
--   holder description. Written by each attempt of a waiter that queues.
-- The bookkeeping hash's field `granted` names the waiter a release handed
--   the lock to, until that waiter (or anyone) takes the lock by an
--   attempt or the next grant: a waiter that gives up before it learned of
--   the grant frees the lock again (fair_leave.lua).

-- The server's clock in milliseconds.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Removes the entries whose deadline has passed; returns how many.
local function prune(queue, deadlines, waiters, now)
  local dead = redis.call('ZRANGEBYSCORE', deadlines, '-inf', now)
  for _, id in ipairs(dead) do
    redis.call('ZREM', queue, id)
    redis.call('ZREM', deadlines, id)
    redis.call('HDEL', waiters, id)
  end
  return #dead
end

-- Whether any waiter is queued, dead or alive, in one call: the deadlines
-- set exists exactly while the queue does, as every script that adds to
-- or takes from one does the same to the other in the same step.
local function queued(deadlines)
  return redis.call('EXISTS', deadlines) == 1
end

-- The oldest live waiter, or nil.
local function head(queue)
  return redis.call('ZRANGE', queue, 0, 0)[1]
end

local function leave(queue, deadlines, waiters, id)
  redis.call('ZREM', queue, id)
  redis.call('ZREM', deadlines, id)
  redis.call('HDEL', waiters, id)
end

-- The lock is free: hand it to the oldest live waiter. A waiter whose last
-- attempt is at most `fresh` ms old (it polls far more often while it
-- lives) is granted the lock here, with its own token, TTL and
-- description, and told so on its own channel (PREFIX .. id) with
-- 'granted:FENCE': it holds the lock without another round trip. An older
-- entry (a waiter that may have died, which is then not granted a lock it
-- would hold for a whole TTL) or one without a WAITERS record (a polylock
-- version that did not write it) is only woken, with '0', to try. With an
-- empty queue, everyone on the lock's channel is woken. Returns nothing.
local function hand_over(lock, book, queue, deadlines, waiters, prefix, channel, fresh)
  if not queued(deadlines) then
    redis.call('PUBLISH', channel, '0')
    return
  end
  local now = now_ms()
  prune(queue, deadlines, waiters, now)
  local h = head(queue)
  if not h then
    redis.call('PUBLISH', channel, '0')
    return
  end
  local entry = redis.call('HGET', waiters, h)
  if entry then
    local ttl, seen, token, meta = string.match(entry, '^(%d+):(%d+):(%x+):(.*)$')
    if ttl and now - tonumber(seen) <= tonumber(fresh) then
      local r = grant_to(lock, book, token, ttl, meta)
      if r and not r.err then
        leave(queue, deadlines, waiters, h)
        redis.call('HSET', book, 'granted', h)
        redis.call('PUBLISH', prefix .. h, 'granted:' .. redis.call('HGET', book, 'fence'))
        return
      end
    end
  end
  redis.call('PUBLISH', prefix .. h, '0')
end
