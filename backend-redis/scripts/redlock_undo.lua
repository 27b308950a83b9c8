-- Redlock: undo an acquire attempt that did not become a lease (no quorum,
-- no validity left) on a node, also one that never answered: its grant may
-- have happened with the reply lost. Compare-and-delete by the attempt's
-- own value (owner token and attempt nonce) alone, because such a node's
-- fencing counter is unknown to the client; any other key, a foreign
-- holder's or another attempt's, is never touched.
--
-- KEYS[1] lock key    ARGV[1] the attempt's value    ARGV[2] release channel
--
-- Returns 1 when our key was removed, 0 when there was none.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], '0')
  return 1
end
return 0
