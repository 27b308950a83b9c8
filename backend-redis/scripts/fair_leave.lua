-- plain format, fair mode: a waiter that gave up (timed out, failed,
-- cancelled) leaves the queue (fair_queue.lua). A lock a release handed to
-- it that it never took up (the `granted` mark still names it and the lock
-- still holds that grant's token) is freed. If it was first, or freed the
-- lock, and the lock is free, the lock goes to the next waiter, since no
-- release will come.
--
-- KEYS[1] lock key, KEYS[2] bookkeeping hash, KEYS[3] queue, KEYS[4] queue
-- deadlines, KEYS[5] queued waiters.
-- ARGV[1] waiter id, ARGV[2] wake channel prefix, ARGV[3] release channel,
-- ARGV[4] as ARGV[5] of fair_release.lua.
--
-- Returns 1 if the entry was there, 2 if a lock granted to it was freed, 0
-- if neither.
local lock, book, queue, deadlines, waiters = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local id = ARGV[1]
local was_first = head(queue) == id
local n = redis.call('ZREM', queue, id)
redis.call('ZREM', deadlines, id)
redis.call('HDEL', waiters, id)
if redis.call('HGET', book, 'granted') == id then
  local holder = redis.call('GET', lock)
  if holder and holder == redis.call('HGET', book, 'owner') then
    redis.call('DEL', lock)
    redis.call('HDEL', book, 'meta', 'granted')
    n = 2
    was_first = true
  end
end
if was_first and redis.call('EXISTS', lock) == 0 then
  hand_over(lock, book, queue, deadlines, waiters, ARGV[2], ARGV[3], ARGV[4])
end
return n
