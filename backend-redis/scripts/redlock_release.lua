-- Redlock: release (release() is in plain_release_fn.lua, and the keys and
-- arguments are its own), plus one case the plain format cannot allow:
-- a key that holds this attempt's value under a fencing counter above the
-- lease's token. On one server that is another holding of the same owner,
-- taken after this lease was lost; a Redlock value carries the attempt's
-- nonce, so there the key can only be this attempt's own grant on a node
-- whose counter was re-seeded above the majority's token (its answer did
-- not count). It is removed as the release of this lease, instead of
-- blocking that node until its TTL.
local r = release(function()
  redis.call('PUBLISH', ARGV[3], '0')
end)
if r == -1 and redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('HDEL', KEYS[2], 'meta')
  redis.call('PUBLISH', ARGV[3], '0')
  return 1
end
return r
