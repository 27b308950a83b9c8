-- Shared by both acquire scripts (prepended to them at build time).
--
-- The value a fencing counter starts from when it does not exist: the
-- server's clock in microseconds. A counter that existed before and was
-- evicted (an allkeys-* maxmemory policy) or lost starts again above every
-- token it handed out, unless it had been bumped more than once per
-- microsecond since its creation, which Redis cannot do, or the server's
-- clock was stepped back meanwhile. A first counter starts there as well,
-- so fencing tokens are large numbers from the start.
local function fence_seed()
  local t = redis.call('TIME')
  return t[1] .. string.format('%06d', tonumber(t[2]))
end
