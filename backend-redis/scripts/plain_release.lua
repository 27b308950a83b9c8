-- plain format: release (release() is in plain_release_fn.lua) and wake
-- every waiter on the lock's channel.
-- ARGV[4], optional: the attempt whose grant alone may be released.
return release(function()
  redis.call('PUBLISH', ARGV[3], '0')
end, ARGV[4])
