-- plain format: take the lock, and bump its fencing counter in the same
-- atomic step, so no two holders can ever see the same token.
--
-- KEYS[1] lock key (string: the owner token)   ARGV[1] owner token
-- KEYS[2] fencing counter                       ARGV[2] TTL in milliseconds
--
-- Returns {1, fence} when taken, {0, pttl} when someone else holds it
-- (pttl -1: the holder set no expiry).
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local fence = redis.pcall('INCR', KEYS[2])
  if type(fence) == 'table' and fence.err then
    -- Scripts are not rolled back: undo the SET we just made, so a broken
    -- counter cannot leave an orphaned lock behind.
    redis.call('DEL', KEYS[1])
    return fence
  end
  return {1, fence}
end
-- SET NX fails on a key of any type; say so instead of reporting "held"
-- forever.
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'string' then
  return redis.error_reply('WRONGTYPE the lock key holds a ' .. kind .. ', not a plain-format lock')
end
return {0, redis.call('PTTL', KEYS[1])}
