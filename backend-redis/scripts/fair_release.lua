-- plain format, fair mode: release (release() is in plain_release_fn.lua)
-- and wake the oldest live waiter only (fair_queue.lua).
--
-- KEYS[1..2] as in plain_release_fn.lua, KEYS[3] queue, KEYS[4] queue
-- deadlines; ARGV[1..3] as there, ARGV[4] the prefix of the waiters' wake
-- channels.
return release(function()
  prune(KEYS[3], KEYS[4], now_ms())
  wake_head(KEYS[3], ARGV[4], ARGV[3])
end)
