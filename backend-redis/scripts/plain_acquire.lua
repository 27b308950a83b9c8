-- plain format: take the lock (grant(), wrong_kind() and recover() are in
-- plain_grant.lua, prepended at build time).
--
-- ARGV[1..3] as in plain_grant.lua; ARGV[4] '1' to take over a grant held
-- under our token that this attempt made (ARGV[5], the attempt's id, which
-- a retry after an unanswered attempt reuses; polylock always asks, since
-- no other grant carries that id): a send whose answer was lost, or that
-- the driver repeated. Any other grant under our token is another
-- acquisition's of the same owner (a lock_core::Owner uses one token for
-- all, on any number of clients), whose pending release would delete it
-- from under us.
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
