-- Shared by the fair-mode scripts (prepended at build time): the queue of
-- waiters of one lock, beside its bookkeeping (same hash tag, same slot).
--
-- QUEUE (a sorted set): waiter id -> arrival number (HINCRBY of the
--   bookkeeping hash's field `qseq`), so its first member is the oldest.
-- DEADLINES (a sorted set): waiter id -> server time (ms) after which the
--   entry is dead. Each attempt of a waiter pushes its deadline on, so a
--   waiter that crashed leaves the queue by itself.

-- The server's clock in milliseconds.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Removes the entries whose deadline has passed; returns how many.
local function prune(queue, deadlines, now)
  local dead = redis.call('ZRANGEBYSCORE', deadlines, '-inf', now)
  for _, id in ipairs(dead) do
    redis.call('ZREM', queue, id)
    redis.call('ZREM', deadlines, id)
  end
  return #dead
end

-- The oldest live waiter, or nil.
local function head(queue)
  return redis.call('ZRANGE', queue, 0, 0)[1]
end

local function leave(queue, deadlines, id)
  redis.call('ZREM', queue, id)
  redis.call('ZREM', deadlines, id)
end

-- Wakes the head waiter alone, on its own channel (PREFIX .. id); with an
-- empty queue, everyone on the lock's channel. Returns nothing.
local function wake_head(queue, prefix, channel)
  local h = head(queue)
  if h then
    redis.call('PUBLISH', prefix .. h, '0')
  else
    redis.call('PUBLISH', channel, '0')
  end
end
