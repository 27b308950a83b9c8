-- plain format, fair mode: release (release() is in plain_release_fn.lua)
-- and hand the lock to the oldest live waiter (fair_queue.lua).
--
-- KEYS[1..2] as in plain_release_fn.lua, KEYS[3] queue, KEYS[4] queue
-- deadlines, KEYS[5] queued waiters; ARGV[1..3] as there, ARGV[4] the
-- prefix of the waiters' wake channels, ARGV[5] how recent (ms) a waiter's
-- last attempt must be for the lock to be granted to it here; ARGV[6],
-- optional, the attempt whose grant alone may be released.
return release(function()
  hand_over(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[4], ARGV[3], ARGV[5])
end, ARGV[6])
