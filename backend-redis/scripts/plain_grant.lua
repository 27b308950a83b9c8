-- Shared by the plain and the fair acquire scripts (prepended to them at
-- build time, after fence_seed.lua).
--
-- KEYS[1] lock key (string: the owner token)   ARGV[1] owner token
-- KEYS[2] bookkeeping hash (fence, owner,     ARGV[2] TTL in milliseconds
--         meta)                               ARGV[3] holder description line,
--                                               '' or absent for none
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

-- Takes the lock if it is free, bumping the fencing counter in the same
-- atomic step, so no two holders can ever see the same token. Returns
-- {1, fence}, an error reply, or nil when the key exists.
local function grant()
  if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return nil
  end
  local ok = redis.pcall('HSETNX', KEYS[2], 'fence', fence_seed())
  if type(ok) == 'table' and ok.err then
    -- Scripts are not rolled back: undo the SET we just made, so a broken
    -- counter cannot leave an orphaned lock behind.
    redis.call('DEL', KEYS[1])
    return ok
  end
  local fence = redis.call('HINCRBY', KEYS[2], 'fence', 1)
  redis.call('HSET', KEYS[2], 'owner', ARGV[1])
  describe()
  return {1, fence}
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
-- nil.
local function recover()
  if redis.call('GET', KEYS[1]) == ARGV[1] and redis.call('HGET', KEYS[2], 'owner') == ARGV[1] then
    local fence = redis.call('HGET', KEYS[2], 'fence')
    if fence then
      redis.call('PEXPIRE', KEYS[1], ARGV[2])
      describe()
      return {1, tonumber(fence)}
    end
  end
  return nil
end
