-- Redlock: undo an acquire attempt that did not become a lease (no quorum,
-- no validity left) on a node, also one that never answered: its grant may
-- have happened with the reply lost. Compare-owner-and-delete by the
-- attempt's owner token alone, because such a node's fencing counter is
-- unknown to the client; a foreign holder's key is never touched.
--
-- KEYS[1] lock key    ARGV[1] owner token    ARGV[2] release channel
--
-- Returns 1 when our key was removed, 0 when there was none.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], '0')
  return 1
end
return 0
