-- plain format: release (release() is in plain_release_fn.lua) and wake
-- every waiter on the lock's channel.
return release(function()
  redis.call('PUBLISH', ARGV[3], '0')
end)
