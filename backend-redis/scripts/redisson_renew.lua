-- redisson format: renew one lease (renew() is in redisson_renew_fn.lua).
--
-- KEYS[1] the lock hash    ARGV[1] holder field     ARGV[3] TTL in milliseconds
-- KEYS[2] fencing counter  ARGV[2] fencing token
return renew(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3])
