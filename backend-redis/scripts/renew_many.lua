-- Either format: renew a batch of leases in one script run, each exactly as
-- the format's single renew does (renew() is prepended at build time from
-- plain_renew_fn.lua or redisson_renew_fn.lua).
--
-- KEYS[1] the first lease's lock key: declared only so that a cluster client
-- routes the call to the node of its slot.
-- ARGV, five per lease: lock key, bookkeeping key (plain) or fencing
-- counter (redisson), holder, fencing token, TTL in milliseconds.
--
-- Returns one answer per lease, in order: what renew() returned, or -2 when
-- this lease could not be judged here. On a cluster that is a key whose slot
-- this node does not serve (moved, or being migrated): the client renews
-- those leases one by one, through the driver's redirects. Any other error
-- of one lease (a key of the wrong type) is also -2, so that the single
-- renew reports it; an error only ever comes from a read, before the
-- PEXPIRE, so such a lease was not touched.
local answers = {}
for i = 1, #ARGV, 5 do
  local ok, r = pcall(renew, ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4])
  if ok then
    answers[#answers + 1] = r
  else
    answers[#answers + 1] = -2
  end
end
return answers
