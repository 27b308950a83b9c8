-- plain format: take the lock (grant(), wrong_kind() and recover() are in
-- plain_grant.lua, prepended at build time).
--
-- ARGV[1..3] as in plain_grant.lua; ARGV[4] '1' when an earlier attempt
-- of this owner on this name went unanswered (the client remembers), so
-- a grant held under our token may be that attempt's: only then is it
-- taken over, and only if that attempt made it (ARGV[5], the attempt's
-- id, which a retry after an unanswered attempt reuses).
-- Otherwise it is another acquisition's of the same owner (a
-- lock_core::Owner uses one token for all, on any number of clients),
-- whose pending release would delete it from under us.
--
-- Returns {1, fence} when taken, {0, pttl} when someone else holds it
-- (pttl -1: the holder set no expiry).
local r = grant(ARGV[5])
if r then
  return r
end
r = wrong_kind() or (ARGV[4] == '1' and recover(ARGV[5], ARGV[5]) or nil)
if r then
  return r
end
return {0, redis.call('PTTL', KEYS[1])}
