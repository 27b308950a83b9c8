-- redisson format: take (or re-enter) a Redisson-layout lock.
--
-- KEYS[1] the lock hash (key = the lock name)   ARGV[1] TTL in milliseconds
-- KEYS[2] fencing counter                       ARGV[2] holder field UUID:THREAD
--                                               ARGV[3] 1: an earlier attempt of
--                                                 this holder got no reply
-- KEYS[3] polylock's bookkeeping hash           ARGV[4] holder description
--         (owner: field of the last polylock      line, '' for none
--         grant; attempt: the id of the         ARGV[5] this attempt's id (the
--         attempt that added the last hold;       unanswered one's, when
--         meta)                                   ARGV[3] is 1)
--
-- The hash maps the holder's field to its hold count and carries the
-- expiry. A free lock is taken with count 1 and a new fencing token; the
-- same field again adds a hold and keeps the token (same holding) -- unless
-- the client says an earlier attempt went unanswered and that attempt added
-- the field's last hold: then that hold is taken back with this attempt's
-- TTL and no extra hold. A hold the unanswered attempt did not add (it never
-- ran; the hold is another acquisition's of the same owner) is never taken:
-- this attempt adds its own. (An unanswered hold followed by another
-- acquisition's is then counted twice, and the lock outlives its last
-- release by up to its TTL: late, never shared.) Either way the expiry only
-- moves later (redisson_extend_fn.lua).
--
-- Returns {1, fence} when taken, {0, pttl} when someone else holds it.
-- The description sits in polylock's own hash, never in Redisson's lock
-- hash, beside the field it describes: it is shown only while that field
-- is the live holder.
local function book()
  redis.call('HSET', KEYS[3], 'owner', ARGV[2])
  if ARGV[4] ~= '' then
    redis.call('HSET', KEYS[3], 'meta', ARGV[4])
  else
    redis.call('HDEL', KEYS[3], 'meta')
  end
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  -- Bump the counter first: if it fails nothing has been written yet.
  redis.call('SET', KEYS[2], fence_seed(), 'NX')
  local fence = redis.call('INCR', KEYS[2])
  redis.call('HSET', KEYS[1], ARGV[2], 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  book()
  redis.call('HSET', KEYS[3], 'attempt', ARGV[5])
  return {1, fence}
end
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'hash' then
  return redis.error_reply('WRONGTYPE the lock key holds a ' .. kind .. ', not a Redisson lock hash')
end
if redis.call('HEXISTS', KEYS[1], ARGV[2]) == 1 then
  local booked = redis.call('HGET', KEYS[3], 'owner') == ARGV[2]
  local recovered = ARGV[3] == '1' and booked
    and redis.call('HGET', KEYS[3], 'attempt') == ARGV[5]
  if not recovered then
    redis.call('HINCRBY', KEYS[1], ARGV[2], 1)
    redis.call('HSET', KEYS[3], 'attempt', ARGV[5])
  end
  -- A re-entry keeps the first hold's description; a recovered grant is
  -- this very request's, and bookkeeping that went missing is restored.
  if recovered or not booked then
    book()
  end
  -- Never shortened: another hold of this field may run longer.
  extend(KEYS[1], ARGV[1])
  local fence = redis.call('GET', KEYS[2])
  if not fence then
    redis.call('SET', KEYS[2], fence_seed(), 'NX')
    fence = redis.call('INCR', KEYS[2])
  end
  return {1, tonumber(fence)}
end
return {0, redis.call('PTTL', KEYS[1])}
