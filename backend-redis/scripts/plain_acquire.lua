-- plain format: take the lock (grant(), wrong_kind() and recover() are in
-- plain_grant.lua, prepended at build time).
--
-- Returns {1, fence} when taken, {0, pttl} when someone else holds it
-- (pttl -1: the holder set no expiry).
local r = grant()
if r then
  return r
end
r = wrong_kind() or recover()
if r then
  return r
end
return {0, redis.call('PTTL', KEYS[1])}
