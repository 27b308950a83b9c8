-- Redlock: after a quorum granted the lock, write the highest token the
-- quorum handed out back to this node (counter = max(counter, T)), so that
-- any later majority, which shares a node with this one, counts on from T.
--
-- KEYS[1] lock key          ARGV[1] owner token
-- KEYS[2] bookkeeping hash  ARGV[2] T, the lease's fencing token
--
-- Only while the key still holds our token: a node whose grant already
-- expired is not part of the quorum any more, and its counter is left to
-- whoever holds it now. Returns 1 when this node now holds the lock with
-- counter T, 0 otherwise.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local current = redis.call('HGET', KEYS[2], 'fence')
if current and tonumber(current) > tonumber(ARGV[2]) then
  return 0
end
redis.call('HSET', KEYS[2], 'fence', ARGV[2])
return 1
