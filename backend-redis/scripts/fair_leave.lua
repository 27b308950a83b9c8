-- plain format, fair mode: a waiter that gave up (timed out, failed,
-- cancelled) leaves the queue (fair_queue.lua). If it was first and the
-- lock is free, the next waiter is woken, since no release will come.
--
-- KEYS[1] lock key, KEYS[2] queue, KEYS[3] queue deadlines.
-- ARGV[1] waiter id, ARGV[2] wake channel prefix, ARGV[3] release channel.
--
-- Returns 1 if the entry was there, 0 if not.
local was_first = head(KEYS[2]) == ARGV[1]
local n = redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
if was_first and redis.call('EXISTS', KEYS[1]) == 0 then
  prune(KEYS[2], KEYS[3], now_ms())
  local h = head(KEYS[2])
  if h then
    redis.call('PUBLISH', ARGV[2] .. h, '0')
  end
end
return n
