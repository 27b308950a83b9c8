-- Shared by the redisson format's acquire, renews and release (prepended at
-- build time). The holds of one holder field share the hash's expiry while each
-- lease keeps a deadline of its own, so the expiry may only move later: a
-- hold taken or renewed with a short TTL must not cut off another hold of
-- the same field whose lease runs longer.
--
-- lock: the lock hash; ttl: milliseconds.
local function extend(lock, ttl)
  local left = redis.call('PTTL', lock)
  -- -1: no expiry at all (not one of ours); it gets the TTL, as before.
  if left == -1 or left < tonumber(ttl) then
    redis.call('PEXPIRE', lock, ttl)
  end
end
