-- Either format: remove a lock whoever holds it (an operator's escape
-- hatch), and wake the waiters. The fencing counter is left alone, so
-- tokens keep increasing.
--
-- KEYS[1] lock key    ARGV[1] release channel    ARGV[2] message
--
-- Returns 1 when there was a lock, 0 when there was none.
if redis.call('DEL', KEYS[1]) == 1 then
  redis.call('PUBLISH', ARGV[1], ARGV[2])
  return 1
end
return 0
