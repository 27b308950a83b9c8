-- Shared by the plain and the fair acquire scripts (prepended to them at
-- build time, after fence_seed.lua).
--
-- KEYS[1] lock key (string: the owner token)   ARGV[1] owner token
-- KEYS[2] bookkeeping hash (fence, owner,     ARGV[2] TTL in milliseconds
--         attempt, meta)                      ARGV[3] holder description line,
--                                               '' or absent for none
--
-- `attempt` in the hash names the polylock attempt that made the grant
-- ('' for a fair-mode hand-over, which the `granted` mark names): an owner
-- token may serve several acquisitions (one lock_core::Owner used twice,
-- or with two lockers), and a retry after an unanswered attempt, which
-- carries that attempt's id, may take over that attempt's grant only.
--
-- The description goes in the bookkeeping hash, never in the lock's value
-- (foreign clients compare that value), and a grant without one removes the
-- previous holder's, so it can only ever describe the holder it was written
-- with.
local function describe()
  if ARGV[3] and ARGV[3] ~= '' then
    redis.call('HSET', KEYS[2], 'meta', ARGV[3])
  else
    redis.call('HDEL', KEYS[2], 'meta')
  end
end

-- Takes `lock` for `token` if it is free, bumping the fencing counter in
-- `book` in the same atomic step, so no two holders can ever see the same
-- token. Also used by the fair mode's hand-over to a queued waiter, so it
-- clears the mark of such a grant (`granted`, fair_queue.lua): the mark
-- only ever names the waiter of the current grant. `attempt` is the
-- granting attempt's id (nil for a hand-over). Returns {1, fence},
-- an error reply, or nil when the key exists.
local function grant_to(lock, book, token, ttl, meta, attempt)
  if not redis.call('SET', lock, token, 'NX', 'PX', ttl) then
    return nil
  end
  local fence = redis.pcall('HINCRBY', book, 'fence', 1)
  if type(fence) == 'table' and fence.err then
    -- Scripts are not rolled back: undo the SET we just made, so a broken
    -- counter cannot leave an orphaned lock behind.
    redis.call('DEL', lock)
    return fence
  end
  if fence == 1 then
    -- There was no counter: start it from the seed (fence_seed.lua)
    -- instead, in the same atomic step, so nobody ever sees the 1. Only
    -- here, so that the usual grant does not read the clock.
    redis.call('HSET', book, 'fence', fence_seed())
    fence = redis.call('HINCRBY', book, 'fence', 1)
  end
  -- The owner, the description (or none) and no fair-mode grant mark, in
  -- as few calls as the description allows.
  if meta and meta ~= '' then
    redis.call('HSET', book, 'owner', token, 'attempt', attempt or '', 'meta', meta)
    redis.call('HDEL', book, 'granted')
  else
    redis.call('HSET', book, 'owner', token, 'attempt', attempt or '')
    redis.call('HDEL', book, 'meta', 'granted')
  end
  return {1, fence}
end

-- This attempt's grant, made by the attempt `attempt`.
local function grant(attempt)
  return grant_to(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], attempt)
end

-- SET NX fails on a key of any type; say so instead of reporting "held"
-- forever. Returns an error reply, or nil for a string (or no key).
local function wrong_kind()
  local kind = redis.call('TYPE', KEYS[1])['ok']
  if kind ~= 'string' and kind ~= 'none' then
    return redis.error_reply('WRONGTYPE the lock key holds a ' .. kind .. ', not a plain-format lock')
  end
  return nil
end

-- Our own grant, by an earlier attempt of this request whose reply never
-- arrived (timed out, or its future dropped): the key holds our token and
-- the last grant was ours, so the counter is that grant's token. Taken over
-- with this attempt's TTL instead of waiting for ourselves: {1, fence}, or
-- nil. `attempt` (the unanswered attempt's id, which the retry carries)
-- must have made that grant; nil when the grant is known to be this
-- waiter's otherwise (a fair-mode hand-over's `granted` mark names it).
-- The grant is then recorded as `claimer`'s (this attempt's id), so that
-- its own retry or undo, should this answer be lost too, recognises it.
local function recover(attempt, claimer)
  if redis.call('GET', KEYS[1]) == ARGV[1] and redis.call('HGET', KEYS[2], 'owner') == ARGV[1]
    and (attempt == nil or redis.call('HGET', KEYS[2], 'attempt') == attempt) then
    local fence = redis.call('HGET', KEYS[2], 'fence')
    if fence then
      redis.call('PEXPIRE', KEYS[1], ARGV[2])
      redis.call('HSET', KEYS[2], 'attempt', claimer)
      -- Claimed: a fair waiter's late leave must not free it any more.
      redis.call('HDEL', KEYS[2], 'granted')
      describe()
      return {1, tonumber(fence)}
    end
  end
  return nil
end
