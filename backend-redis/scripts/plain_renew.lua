-- plain format: renew one lease (renew() is in plain_renew_fn.lua).
--
-- KEYS[1] lock key          ARGV[1] owner token     ARGV[3] TTL in milliseconds
-- KEYS[2] bookkeeping hash  ARGV[2] fencing token
return renew(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3])
